#include "ferry/core/neighbours.h"

#include <ATen/Parallel.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/wait.h"

namespace ferry::core {
namespace {

using ferry::testing::wait_until;
using ::testing::HasSubstr;

TEST(Neighbours, EachRunsItsOwnPassesWithOneThreadUntilStopped) {
  std::vector<std::atomic<int>> passes(2);
  std::vector<std::atomic<int>> threads(2);
  Neighbours beside(2, [&](int k, const std::atomic<bool>&) {
    threads[k] = at::get_num_threads();
    ++passes[k];
  });
  EXPECT_TRUE(
      wait_until([&] { return passes[0] >= 3 && passes[1] >= 3; }, std::chrono::seconds(10)));
  beside.stop();
  EXPECT_EQ(threads[0], 1);
  EXPECT_EQ(threads[1], 1);
}

TEST(Neighbours, StopEndsAPassThatWatchesTheFlag) {
  std::atomic<int> passes{0};
  Neighbours beside(1, [&](int, const std::atomic<bool>& stop) {
    if (++passes == 1) return;
    while (!stop) std::this_thread::yield();
  });
  ASSERT_TRUE(wait_until([&] { return passes >= 2; }, std::chrono::seconds(10)));
  beside.stop();
}

// However late a neighbour's thread starts, what was measured before stop() ran beside a whole
// pass of each: stop() sets the flag only then.
TEST(Neighbours, StopWaitsUntilEveryNeighbourHasPassedOnce) {
  std::vector<std::atomic<int>> whole(3);
  Neighbours beside(3, [&](int k, const std::atomic<bool>& stop) {
    for (int step = 0; step < 2000; ++step) {
      if (stop) return;
      std::this_thread::yield();
    }
    ++whole[k];
  });
  beside.stop();
  for (const std::atomic<int>& passes : whole) EXPECT_GE(passes.load(), 1);
}

TEST(Neighbours, StopRethrowsWhatAPassThrew) {
  std::atomic<bool> threw{false};
  Neighbours beside(1, [&](int k, const std::atomic<bool>&) {
    threw = true;
    throw std::runtime_error("neighbour " + std::to_string(k) + " ran out of memory");
  });
  // Stopped before its first pass, a neighbour would have nothing to report.
  ASSERT_TRUE(wait_until([&] { return threw.load(); }, std::chrono::seconds(10)));
  try {
    beside.stop();
    FAIL() << "nothing was thrown";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("neighbour 0 ran out of memory"));
  }
}

TEST(Neighbours, NoneRunsNothing) {
  bool ran = false;
  Neighbours beside(0, [&](int, const std::atomic<bool>&) { ran = true; });
  beside.stop();
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace ferry::core
