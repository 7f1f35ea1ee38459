// Validation's per-class figures from logits and masks: IoU and Dice of each class against counts
// worked out by hand, pixels of the ignore index left out, a binary head as background and
// foreground, and a class found nowhere left out of the means.
#include "trainer/class_scores.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

namespace ferry::trainer {
namespace {

using ::testing::DoubleEq;
using ::testing::ElementsAre;
using ::testing::IsNan;

// Logits whose largest channel is `predicted`'s class at each pixel: [1, K, 1, N].
at::Tensor logits_for(const std::vector<int64_t>& predicted, int64_t classes) {
  at::Tensor ids = torch::tensor(predicted, torch::kLong);
  return torch::one_hot(ids, classes).to(torch::kFloat).t().reshape({1, classes, 1, -1}) * 5;
}

at::Tensor mask_of(const std::vector<int64_t>& truth) {
  return torch::tensor(truth, torch::kLong).reshape({1, 1, 1, -1});
}

TEST(ClassScores, EachClassesIouAndDiceCountItsPixels) {
  // truth:     0 0 1 1 1 2 2 255
  // predicted: 0 1 1 1 2 2 0 2
  ClassCounts counts(3, 255);
  counts.add(logits_for({0, 1, 1, 1, 2, 2, 0, 2}, 3), mask_of({0, 0, 1, 1, 1, 2, 2, 255}));
  const ClassScores s = counts.scores();
  // class 0: hit 1, truth 2, predicted 2; class 1: hit 2, truth 3, predicted 3; class 2: hit 1,
  // truth 2, predicted 2 (the ignored pixel's prediction counts nowhere).
  EXPECT_THAT(s.iou, ElementsAre(DoubleEq(1.0 / 3), DoubleEq(2.0 / 4), DoubleEq(1.0 / 3)));
  EXPECT_THAT(s.dice, ElementsAre(DoubleEq(2.0 / 4), DoubleEq(4.0 / 6), DoubleEq(2.0 / 4)));
  EXPECT_DOUBLE_EQ(s.mean_iou, (2.0 / 4 + 1.0 / 3) / 2);  // the foreground classes
  EXPECT_DOUBLE_EQ(s.miou, (1.0 / 3 + 2.0 / 4 + 1.0 / 3) / 3);
}

TEST(ClassScores, ABinaryHeadScoresItsForegroundAsBeforeAndItsBackgroundBeside) {
  ClassCounts counts(1, std::nullopt);
  at::Tensor logits = torch::tensor({2.0f, -1.0f, 3.0f, -2.0f}).reshape({1, 1, 1, 4});
  at::Tensor masks = torch::tensor({1.0f, 1.0f, 0.0f, 0.0f}).reshape({1, 1, 1, 4});
  counts.add(logits, masks);
  counts.add(counts);  // summing twice changes no ratio
  const ClassScores s = counts.scores();
  EXPECT_DOUBLE_EQ(s.mean_iou, 1.0 / 3);  // foreground: 1 hit of 3 in either
  EXPECT_DOUBLE_EQ(s.mean_dice, 2.0 / 4);
  EXPECT_DOUBLE_EQ(s.miou, (1.0 / 3 + 1.0 / 3) / 2);
}

TEST(ClassScores, AClassFoundNowhereHasNoFigureAndLeavesTheMeans) {
  ClassCounts counts(4, std::nullopt);
  counts.add(logits_for({0, 1, 1}, 4), mask_of({0, 1, 1}));
  const ClassScores s = counts.scores();
  EXPECT_THAT(s.iou, ElementsAre(DoubleEq(1), DoubleEq(1), IsNan(), IsNan()));
  EXPECT_DOUBLE_EQ(s.mean_iou, 1);
  EXPECT_DOUBLE_EQ(s.miou, 1);
  ClassCounts empty(2, std::nullopt);
  EXPECT_DOUBLE_EQ(empty.scores().mean_iou, 1);  // nothing to find, nothing found
}

}  // namespace
}  // namespace ferry::trainer
