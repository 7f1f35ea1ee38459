// The best epoch and early stopping over a metric's values, as a run would see them.
#include "trainer/epoch_monitor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "ferry/rpc/error.h"

namespace ferry::trainer {
namespace {

using ::testing::HasSubstr;

TEST(EpochMonitor, HigherIouIsBetterAndPatienceCountsEpochsWithoutImprovement) {
  EpochMonitor monitor(Monitor::ValIou, 2);
  EXPECT_TRUE(monitor.observe(1, 0.40).improved);
  EXPECT_TRUE(monitor.observe(2, 0.55).improved);
  EpochMonitor::Verdict third = monitor.observe(3, 0.50);
  EXPECT_FALSE(third.improved);
  EXPECT_FALSE(third.stop);
  // An equal value is no improvement either.
  EpochMonitor::Verdict fourth = monitor.observe(4, 0.55);
  EXPECT_FALSE(fourth.improved);
  EXPECT_TRUE(fourth.stop);
  EXPECT_EQ(monitor.best_epoch(), 2);
  EXPECT_DOUBLE_EQ(monitor.best_value(), 0.55);
}

TEST(EpochMonitor, LowerLossIsBetterAndAnImprovementResetsThePatience) {
  EpochMonitor monitor(Monitor::ValLoss, 2);
  monitor.observe(1, 0.9);
  EXPECT_FALSE(monitor.observe(2, 1.1).stop);
  EXPECT_TRUE(monitor.observe(3, 0.7).improved);
  EXPECT_EQ(monitor.stale_epochs(), 0);
  EXPECT_FALSE(monitor.observe(4, 0.8).stop);
  EXPECT_TRUE(monitor.observe(5, 0.8).stop);
  EXPECT_EQ(monitor.best_epoch(), 3);
}

TEST(EpochMonitor, WithoutPatienceItNeverStops) {
  EpochMonitor monitor(Monitor::ValDice, 0);
  monitor.observe(1, 0.9);
  for (int epoch = 2; epoch < 50; ++epoch) EXPECT_FALSE(monitor.observe(epoch, 0.1).stop);
  EXPECT_EQ(monitor.best_epoch(), 1);
}

TEST(EpochMonitor, ARestoredMonitorGoesOnAsTheOneThatWasSaved) {
  EpochMonitor saved(Monitor::ValIou, 3);
  saved.observe(1, 0.6);
  saved.observe(2, 0.5);
  EpochMonitor resumed(Monitor::ValIou, 3);
  resumed.restore(saved.best_epoch(), saved.best_value(), saved.stale_epochs());
  for (int epoch = 3; epoch <= 4; ++epoch) {
    EpochMonitor::Verdict a = saved.observe(epoch, 0.55), b = resumed.observe(epoch, 0.55);
    EXPECT_EQ(a.improved, b.improved);
    EXPECT_EQ(a.stop, b.stop);
    // The third epoch without improvement, counting the one before the save, is the last.
    EXPECT_EQ(b.stop, epoch == 4);
  }
  EXPECT_EQ(resumed.best_epoch(), 1);
}

TEST(EpochMonitor, ANegativePatienceNamesTheFlag) {
  try {
    EpochMonitor(Monitor::ValIou, -1);
    FAIL() << "accepted a negative patience";
  } catch (const rpc::Error& e) {
    EXPECT_EQ(e.kind(), rpc::ErrorKind::InvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("--early-stop-patience must be 0 (never) or more, not -1"));
  }
}

}  // namespace
}  // namespace ferry::trainer
