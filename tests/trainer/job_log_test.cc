// Reading a job's course back from its output: the progress bar's lines (as written when the
// output is not a terminal), the takeovers of lost workers by spares, and the returns to a
// checkpoint.
#include "trainer/job_log.h"

#include <gtest/gtest.h>

namespace ferry::trainer {
namespace {

TEST(JobCourse, TheLastProgressLineGivesTheStepCountedOverEpochs) {
  JobCourse course = read_job_course(
      "[1.0 I master] spare workers: worker5, worker6\n"
      "epoch 1/4 [############] 5/5 loss 0.71 ETA 0:00\n"
      "epoch 1/4: train loss 0.7100, validation loss 0.6900, IoU 0.300\n"
      "epoch 2/4 [#####.......] 2/5 loss 0.65 ETA 0:03\n");
  EXPECT_EQ(course.epoch, 2);
  EXPECT_EQ(course.step, 2);
  EXPECT_EQ(course.steps_per_epoch, 5);
  EXPECT_EQ(course.global_step, 7);
  EXPECT_EQ(course.progress_lines, 2);
  EXPECT_TRUE(course.takeovers.empty());
}

TEST(JobCourse, EveryTakeoverOfALineIsReadInOrder) {
  JobCourse course = read_job_course(
      "[2.0 W master] worker \"worker2\" (rank 2) died; worker \"worker2\" was lost; spare "
      "\"worker5\" takes over stage stage1; worker \"worker3\" was lost; spare \"worker6\" takes "
      "over stage stage0, stage1\n"
      "[2.5 W master] training goes on from epoch 2 (the checkpoint in ckpt)\n"
      "epoch 2/4 [##..........] 1/5 loss 0.66 ETA 0:04\n");
  ASSERT_EQ(course.takeovers.size(), 2u);
  EXPECT_EQ(course.takeovers[0].lost, "worker2");
  EXPECT_EQ(course.takeovers[0].spare, "worker5");
  EXPECT_EQ(course.takeovers[1].lost, "worker3");
  EXPECT_EQ(course.takeovers[1].spare, "worker6");
  EXPECT_EQ(course.went_back, 1);
  EXPECT_EQ(course.global_step, 6);
}

TEST(JobCourse, ATerminalsRewrittenLineCountsByItsLastState) {
  JobCourse course =
      read_job_course("\repoch 1/2 [#...] 1/4 ETA 0:09\repoch 1/2 [##..] 2/4 ETA 0:06");
  EXPECT_EQ(course.global_step, 2);
}

}  // namespace
}  // namespace ferry::trainer
