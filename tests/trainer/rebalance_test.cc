// Re-balancing's arithmetic: blocks' costs calibrated by what their stages measured, the cut those
// costs call for, when it is worth a move, and what a move or a budget says.
#include "trainer/rebalance.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ferry::trainer {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Rebalance, EachBlockTakesItsStagesMeasuredOverEstimatedCompute) {
  // Stage 0 (blocks 0-1) estimated 2 s, measured 1 s; stage 1 (block 2..3) estimated 2 s,
  // measured 3 s.
  const std::vector<double> calibrated =
      calibrated_block_s({1.5, 0.5, 1.0, 1.0}, {{0, 2}, {2, 4}}, {1.0, 3.0});
  EXPECT_THAT(calibrated, ElementsAre(DoubleNear(0.75, 1e-12), DoubleNear(0.25, 1e-12),
                                      DoubleNear(1.5, 1e-12), DoubleNear(1.5, 1e-12)));
  // A stage that measured nothing keeps its estimate.
  EXPECT_THAT(calibrated_block_s({1.0, 2.0}, {{0, 1}, {1, 2}}, {0.0, 4.0}),
              ElementsAre(DoubleNear(1.0, 1e-12), DoubleNear(4.0, 1e-12)));
}

TEST(Rebalance, TheProposalIsTheMinMaxCutOfTheCalibratedCosts) {
  // Measured 1 s and 3 s: the best cut of 0.75, 0.25, 1.5, 1.5 puts block 2 with the first two.
  const Recut recut = propose_recut({0.75, 0.25, 1.5, 1.5}, {1.0, 3.0});
  ASSERT_EQ(recut.ranges.size(), 2u);
  EXPECT_EQ(recut.ranges[0], (pipeline::Range{0, 3}));
  EXPECT_EQ(recut.ranges[1], (pipeline::Range{3, 4}));
  EXPECT_THAT(recut.predicted_s, ElementsAre(DoubleNear(2.5, 1e-12), DoubleNear(1.5, 1e-12)));
  EXPECT_DOUBLE_EQ(recut.slowest_s, 3.0);
  EXPECT_DOUBLE_EQ(recut.predicted_slowest_s, 2.5);
  EXPECT_TRUE(recut.moves({{0, 2}, {2, 4}}));
  EXPECT_TRUE(recut.worth_it());
}

TEST(Rebalance, AMoveMustShortenTheSlowestStageByFivePercent) {
  Recut recut;
  recut.slowest_s = 1.0;
  recut.predicted_slowest_s = 0.96;
  EXPECT_FALSE(recut.worth_it());
  recut.predicted_slowest_s = 0.95;
  EXPECT_TRUE(recut.worth_it());
  EXPECT_DOUBLE_EQ(imbalance({1.0, 1.2, 0.8}), 1.5);
}

StagePlan plan_of(std::vector<std::pair<std::string, double>> stages) {
  StagePlan plan;
  for (auto& [blocks, peak] : stages) {
    PlannedStage stage;
    stage.name = "stage" + std::to_string(plan.stages.size());
    stage.blocks = blocks;
    stage.peak_mib = peak;
    plan.stages.push_back(stage);
  }
  return plan;
}

TEST(Rebalance, AMoveNamesTheStagesWhoseBlocksChange) {
  const StagePlan from = plan_of({{"stem..layer2.1", 10}, {"layer3.0..head", 10}});
  const StagePlan to = plan_of({{"stem..layer3.1", 10}, {"layer4.0..head", 10}});
  EXPECT_EQ(describe_move(from, to),
            "stage0 stem..layer2.1 -> stem..layer3.1, stage1 layer3.0..head -> layer4.0..head");
}

TEST(Rebalance, ABudgetCountsEveryStageOfAWorker) {
  const StagePlan plan = plan_of({{"a", 100}, {"b", 150}, {"c", 60}});
  EXPECT_EQ(over_budget(plan, {"worker1", "worker2", "worker3"}, 0), "");
  EXPECT_EQ(over_budget(plan, {"worker1", "worker2", "worker3"}, 160), "");
  EXPECT_EQ(over_budget(plan, {"worker1", "worker2", "worker3"}, 120),
            "stage1 (b) on worker2 would peak at an estimated 150 MiB, over the budget of "
            "120 MiB per process");
  // Stages a and c share worker1: 160 MiB there.
  EXPECT_THAT(over_budget(plan, {"worker1", "worker2/cuda:0", "worker1"}, 155),
              HasSubstr("stage0 (a) on worker1 would peak at an estimated 160 MiB; stage2 (c) on "
                        "worker1 would peak at an estimated 160 MiB, over the budget of 155 MiB"));
  // Each worker its own budget: worker2's 140 binds, worker1's 400 does not.
  WorkerBudgets each;
  each.by_worker = {{"worker1", 400}, {"worker2", 140}, {"worker3", 400}};
  EXPECT_EQ(over_budget(plan, {"worker1", "worker2/cuda:0", "worker1"}, each),
            "stage1 (b) on worker2/cuda:0 would peak at an estimated 150 MiB, over its worker's "
            "budget of 140 MiB");
  each.by_worker["worker2"] = 150;
  EXPECT_EQ(over_budget(plan, {"worker1", "worker2", "worker3"}, each), "");
}

// A worker-to-worker handover holds a worker's old stage and its new one at once: the larger of
// the old state parked a second time (serialised optimizer state) and old plus new.
TEST(Rebalance, AHandoverCountsTheOldStateBesideTheNew) {
  const auto mib = [](double m) { return static_cast<int64_t>(m * (1 << 20) / sizeof(float)); };
  StagePlan from = plan_of({{"stem..layer3.1", 0}, {"layer4.0..head", 0}});
  StagePlan to = plan_of({{"stem..layer2.1", 0}, {"layer3.0..head", 0}});
  from.stages[0].parameters = mib(10);  // Adam: 30 MiB held, 50 parked twice
  from.stages[1].parameters = mib(4);
  to.stages[0].parameters = mib(2);
  to.stages[1].parameters = mib(12);
  const std::vector<std::string> places{"worker1", "worker2"};
  EXPECT_EQ(handover_over_budget(from, to, places, 2, 0), "");
  EXPECT_EQ(handover_over_budget(from, to, places, 2, 50), "");
  EXPECT_EQ(handover_over_budget(from, to, places, 2, 49),
            "worker1 would hold an estimated 50 MiB, over the budget of 49 MiB per process");
  // worker2: 12 old and 36 new.
  EXPECT_THAT(handover_over_budget(from, to, places, 2, 47),
              HasSubstr("worker2 would hold an estimated 48 MiB"));
  // SGD's momentum: 20 MiB parked twice on worker1; 8 + 24 on worker2.
  EXPECT_EQ(handover_over_budget(from, to, places, 1, 32), "");
}

}  // namespace
}  // namespace ferry::trainer
