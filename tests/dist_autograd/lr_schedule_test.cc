// Learning-rate schedules: their curves at the points that define them, and their bad settings.
#include "ferry/dist_autograd/lr_schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "tests/support/error_of.h"

namespace ferry::dist_autograd {
namespace {

using ::testing::DoubleNear;
using testing::error_of;
using ::testing::HasSubstr;

TEST(LrSchedule, ConstantWarmsUpLinearlyThenHolds) {
  LrSchedule s = LrSchedule::of(LrSchedule::Kind::Constant, 0.1, 100, 4, 0, 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.02);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.08);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(99), 0.1);
}

TEST(LrSchedule, StepMultipliesByGammaEveryStepSize) {
  LrSchedule s = LrSchedule::of(LrSchedule::Kind::Step, 1.0, 100, 0, 10, 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(25), 0.25);
  // Without a step size, the rate drops three times over the run.
  LrSchedule thirds = LrSchedule::of(LrSchedule::Kind::Step, 1.0, 90, 0, 0, 0.1);
  EXPECT_EQ(thirds.step_size, 30);
  EXPECT_THAT(thirds.lr_at(89), DoubleNear(0.01, 1e-12));
}

TEST(LrSchedule, CosineFallsFromTheRateTowardsZeroAfterTheWarmUp) {
  LrSchedule s = LrSchedule::of(LrSchedule::Kind::Cosine, 0.2, 110, 10, 0, 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.2);
  EXPECT_THAT(s.lr_at(60), DoubleNear(0.1, 1e-12));  // half way: half the rate
  EXPECT_GT(s.lr_at(109), 0);
  EXPECT_LT(s.lr_at(109), 0.2 * 1e-3);
  for (int step = 11; step < 110; ++step) EXPECT_LT(s.lr_at(step), s.lr_at(step - 1)) << step;
  EXPECT_EQ(s.describe(), "cosine from 0.2 over 110 steps, 10 warm-up");
}

TEST(LrSchedule, OneCycleRisesFromATwentyFifthToTheRateThenFallsFarBelowIt) {
  LrSchedule s = LrSchedule::of(LrSchedule::Kind::OneCycle, 1.0, 101, -1, 0, 0.1);
  EXPECT_EQ(s.warmup_steps, 30);  // 30% of the run, as PyTorch's pct_start
  EXPECT_THAT(s.lr_at(0), DoubleNear(1.0 / 25, 1e-12));
  EXPECT_DOUBLE_EQ(s.lr_at(30), 1.0);
  EXPECT_THAT(s.lr_at(100), DoubleNear(1.0 / 25 / 1e4, 1e-15));
}

TEST(LrSchedule, BadSettingsSayWhatIsWrong) {
  EXPECT_THAT(
      error_of([] { core::parse_named(LrSchedule::kind_names(), "linear", "--lr-schedule"); }),
      HasSubstr("--lr-schedule must be constant, step, cosine or onecycle, not \"linear\""));
  EXPECT_THAT(error_of([] { LrSchedule::of(LrSchedule::Kind::Cosine, 0.1, 10, 10, 0, 0.1); }),
              HasSubstr("10 warm-up steps leave none of the run's 10 optimizer steps"));
  EXPECT_THAT(error_of([] { LrSchedule::of(LrSchedule::Kind::Step, 0.1, 10, 0, 2, 1.5); }),
              HasSubstr("factor must be in (0, 1], not 1.5"));
  EXPECT_THAT(error_of([] { LrSchedule::of(LrSchedule::Kind::Constant, 0, 10, 0, 0, 0.1); }),
              HasSubstr("must be above 0, not 0"));
  EXPECT_THAT(error_of([] { LrSchedule::of(LrSchedule::Kind::Constant, 0.1, 0, 0, 0, 0.1); }),
              HasSubstr("at least one optimizer step, not 0"));
}

}  // namespace
}  // namespace ferry::dist_autograd
