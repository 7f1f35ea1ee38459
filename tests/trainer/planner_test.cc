// The planner's search on hand-made cost tables (nothing measured): the configuration it must
// find, the same with a budget that rules it out, and what it says when nothing fits; and the
// block-cost cache's keys.
#include "trainer/planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ferry/models/unet_blocks.h"
#include "tests/support/temp_dir.h"
#include "trainer/block_cost_cache.h"
#include "trainer/stage_plan.h"

namespace ferry::trainer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::ThrowsMessage;

// The U-Net-ResNet-18's blocks, each alike: 8 MiB of parameters, 1 MiB of activations and
// 0.1 MiB of carry per image, 10 ms of forward and 20 ms of backward per image, and 1 ms of
// each per pass whatever its size.
std::vector<models::BlockCost> alike_blocks() {
  std::vector<models::BlockCost> out;
  for (const models::UnetBlock& b : models::unet_blocks(18)) {
    models::BlockCost c;
    c.name = b.name;
    c.parameters = 2 << 20;
    c.parameter_bytes = 8 << 20;
    c.largest_parameter_bytes = 1 << 19;
    c.activation_bytes_per_sample = 1 << 20;
    c.output_bytes_per_sample = 0.1 * kMiB;
    c.carry_bytes_per_sample = 0.1 * kMiB;
    c.forward = {0.001, 0.010};
    c.backward = {0.001, 0.020};
    out.push_back(c);
  }
  return out;
}

// Two workers on two cores, one each; links fast enough not to matter.
MachineCosts two_cores() {
  MachineCosts m;
  m.cores = 2;
  m.cores_per_worker = 1;
  m.link_bytes_per_s = 1e18;
  return m;
}

PlanRequest request_for(int workers, int64_t batch, double budget_mib) {
  PlanRequest r;
  r.model = "unet-resnet18";
  r.image_size = 64;
  r.workers = workers;
  r.batch_size = batch;
  r.budget_mib = budget_mib;
  return r;
}

TEST(Planner, WithoutABudgetTwoReplicasOfTheWholeModelAreFastestOnTwoWorkers) {
  const std::vector<models::BlockCost> costs = alike_blocks();
  const std::vector<Candidate> plan = plan_candidates(costs, two_cores(), request_for(2, 16, 0));
  const Candidate& best = plan.front();
  EXPECT_EQ(best.stages, 1);
  EXPECT_EQ(best.replicas, 2);
  EXPECT_EQ(best.schedule, std::nullopt);
  EXPECT_EQ(best.batch_size, 8);
  // Each replica's step: 8 images through every block once, forward and backward.
  const double blocks = static_cast<double>(costs.size());
  EXPECT_NEAR(best.predicted_step_s, blocks * (0.002 + 8 * 0.030), 1e-9);
  EXPECT_NEAR(best.predicted_images_per_s(), 16 / best.predicted_step_s, 1e-9);
  // One process on one worker is among the candidates, at half the speed.
  auto single = std::find_if(plan.begin(), plan.end(), [](const Candidate& c) {
    return c.stages == 1 && c.replicas == 1 && !c.schedule;
  });
  ASSERT_NE(single, plan.end());
  EXPECT_NEAR(single->predicted_step_s, blocks * (0.002 + 16 * 0.030), 1e-9);
}

TEST(Planner, ABudgetThatRulesOutTheWholeModelOnAWorkerGivesABalancedTwoStageCut) {
  const std::vector<models::BlockCost> costs = alike_blocks();
  const auto n = static_cast<int64_t>(costs.size());
  // The whole model's optimizer step (40 MiB per block with Adam: the parameters, two moments
  // and the gradients twice) does not fit; half of it does.
  const double budget = 40.0 * static_cast<double>(n) * 0.75 + 40;
  const std::vector<Candidate> plan =
      plan_candidates(costs, two_cores(), request_for(2, 16, budget));
  for (const Candidate& c : plan) {
    EXPECT_EQ(c.stages, 2) << c.describe();
    EXPECT_LE(c.predicted_largest_peak_mib(), budget) << c.describe();
  }
  const Candidate& best = plan.front();
  ASSERT_TRUE(best.schedule.has_value());  // a pipeline beats naive model parallelism
  // The blocks are alike in time: the cut halves them (15 blocks: 7 and 8).
  ASSERT_EQ(best.cut.size(), 2u);
  EXPECT_EQ(best.cut[0].begin, 0);
  EXPECT_EQ(best.cut[1].end, n);
  EXPECT_EQ(best.cut[0].end, best.cut[1].begin);
  EXPECT_LE(std::abs(best.cut[0].size() - best.cut[1].size()), 1);
  const std::vector<std::string> names = [&] {
    std::vector<std::string> out;
    for (const auto& c : costs) out.push_back(c.name);
    return out;
  }();
  EXPECT_THAT(
      best.flags(request_for(2, 16, budget), names),
      AllOf(HasSubstr("--stages 2 --partition " + names[static_cast<size_t>(best.cut[1].begin)]),
            HasSubstr("--batch-size 16"),
            HasSubstr("--pipeline " + pipeline::schedule_name(*best.schedule))));
}

// Workers of unequal memory: each stage of every candidate fits the least of the workers its
// copies go to (replica r's stages on the r-th share of the workers, in order), and a small
// second worker gets the shorter stage.
TEST(Planner, EachStageFitsTheBudgetOfTheWorkersItsCopiesGoTo) {
  const std::vector<models::BlockCost> costs = alike_blocks();
  for (const std::vector<double>& budgets :
       {std::vector<double>{560, 200}, std::vector<double>{560, 200, 330, 560}}) {
    PlanRequest r = request_for(static_cast<int>(budgets.size()), 16, 560);
    r.worker_budget_mib = budgets;
    const std::vector<Candidate> plan = plan_candidates(costs, two_cores(), r);
    ASSERT_FALSE(plan.empty());
    for (const Candidate& c : plan) {
      const int share = r.workers / c.replicas;
      for (int k = 0; k < c.stages; ++k) {
        double least = 1e18;
        for (int copy = 0; copy < c.replicas; ++copy) {
          least = std::min(least, budgets[static_cast<size_t>(copy * share + k)]);
        }
        EXPECT_LE(c.predicted_peak_mib[static_cast<size_t>(k)], least)
            << c.describe() << ", stage " << k;
      }
    }
  }
  PlanRequest two = request_for(2, 16, 560);
  two.worker_budget_mib = {560, 200};
  const Candidate best = plan_candidates(costs, two_cores(), two).front();
  ASSERT_EQ(best.stages, 2) << best.describe();
  EXPECT_LT(best.cut[1].size(), best.cut[0].size());
  std::vector<std::string> names;
  for (const auto& c : costs) names.push_back(c.name);
  EXPECT_THAT(best.flags(two, names), HasSubstr("--memory-budget-mib 560,200"));
  // The state of the 15 blocks (600 MiB) cut over two workers of 200 MiB does not fit.
  PlanRequest small = request_for(2, 16, 200);
  small.worker_budget_mib = {200, 200};
  EXPECT_THAT([&] { plan_candidates(costs, two_cores(), small); },
              ThrowsMessage<NothingFits>(AllOf(HasSubstr("on 2 workers of 200, 200 MiB:"),
                                               HasSubstr("cut into 2 stages, exceed"))));
}

// A verified candidate of several workers gets its measured step beside the estimate, term by
// term, and the term that is off the most named; one of a single worker, or unverified, none.
TEST(Planner, TheTableSaysWhichTermOfAVerifiedStepIsOffTheMost) {
  Candidate pipelined;
  pipelined.stages = 2;
  pipelined.schedule = pipeline::Schedule::ZeroBubble;
  pipelined.microbatches = 2;
  pipelined.batch_size = 16;
  pipelined.predicted_step_s = 0.25;
  pipelined.predicted_terms = {0.25, 0.20, 0.01};
  pipelined.measured_images_per_s = 40;
  pipelined.measured_peak_mib = {150, 180};
  pipelined.measured_terms = {0.40, 0.22, 0.01};  // the rest: 0.17 against 0.04
  Candidate alone = pipelined;
  alone.stages = 1;
  alone.schedule.reset();
  Candidate unchecked = pipelined;
  unchecked.measured_images_per_s = -1;
  const std::string table = candidates_table({pipelined, alone, unchecked}, 3);
  EXPECT_THAT(table, HasSubstr("measured against estimated seconds per step, by term:\n   1 2 "
                               "stages, zb x 2: step 0.400 / 0.250 (+60%); slowest stage 0.220 / "
                               "0.200, optimizer 0.010 / 0.010, the rest 0.170 / 0.040; off the "
                               "most: the rest (fill and drain, carries, all-reduce, the master) "
                               "(+0.130 s)\n"))
      << table;
  EXPECT_THAT(table, Not(HasSubstr("   2 1 stage, plain: step"))) << table;
  EXPECT_THAT(table, Not(HasSubstr("   3 2 stages, zb x 2: step"))) << table;
}

TEST(Planner, TheLargestBatchFillsTheBudgetAndOneImageMoreDoesNot) {
  const std::vector<models::BlockCost> costs = alike_blocks();
  PlanRequest r = request_for(2, 0, 600);
  r.largest_batch = true;
  const std::vector<Candidate> plan = plan_candidates(costs, two_cores(), r);
  Candidate best = plan.front();
  for (const Candidate& c : plan) EXPECT_LE(c.global_batch(), best.global_batch());
  EXPECT_LE(best.predicted_largest_peak_mib(), 600);
  best.batch_size += 1;
  score_candidate(costs, two_cores(), r, best);
  EXPECT_GT(best.predicted_largest_peak_mib(), 600);
}

TEST(Planner, WhenABlocksStateAloneExceedsTheBudgetTheMessageSaysSo) {
  std::vector<models::BlockCost> costs = alike_blocks();
  costs[5].parameter_bytes = 64 << 20;
  costs[5].largest_parameter_bytes = 64 << 20;
  EXPECT_THAT(
      [&] { plan_candidates(costs, two_cores(), request_for(4, 8, 200)); },
      ThrowsMessage<NothingFits>(AllOf(HasSubstr(costs[5].name), HasSubstr("alone take 512 MiB"),
                                       HasSubstr("--optimizer sgd"))));
}

TEST(Planner, WhenTheStateCutOverEveryWorkerExceedsTheBudgetTheMessageSaysSo) {
  // Each block's step (about 42 MiB) fits 100 MiB; half of the 15 blocks does not.
  EXPECT_THAT(
      [] { plan_candidates(alike_blocks(), two_cores(), request_for(2, 8, 100)); },
      ThrowsMessage<NothingFits>(AllOf(HasSubstr("on 2 workers of 100 MiB each"),
                                       HasSubstr("adam state alone, cut into 2 stages, exceed"),
                                       HasSubstr("more workers"))));
}

TEST(Planner, WhenTheActivationsBindTheMessageGivesTheLargestBatchThatFits) {
  EXPECT_THAT([] { plan_candidates(alike_blocks(), two_cores(), request_for(2, 4096, 400)); },
              ThrowsMessage<NothingFits>(AllOf(HasSubstr("batch 4096 does not fit"),
                                               HasSubstr("the largest batch that fits is"))));
}

TEST(Planner, ABatchTheReplicasCannotShareIsNotSplitUnevenly) {
  for (const Candidate& c : plan_candidates(alike_blocks(), two_cores(), request_for(2, 15, 0))) {
    EXPECT_EQ(c.replicas, 1) << c.describe();
    EXPECT_EQ(c.global_batch(), 15);
  }
}

CostKey key() { return {"unet-resnet18", 1, 64, 4, 1, 1, this_machine(), ferry_version()}; }

TEST(BlockCostCache, CostsAreUsedForTheSameKeyAndIgnoredWhenAnythingTheyDependOnDiffers) {
  const std::string dir = ferry::testing::process_temp_dir().file("block-cost-cache");
  std::filesystem::remove_all(dir);
  EXPECT_FALSE(load_costs(dir, key()).has_value());
  CachedCosts costs;
  costs.blocks = alike_blocks();
  costs.machine = two_cores();
  costs.machine.optimizer_s_per_parameter = 2.5e-9;
  save_costs(dir, key(), costs);
  std::optional<CachedCosts> loaded = load_costs(dir, key());
  ASSERT_TRUE(loaded.has_value());
  ASSERT_EQ(loaded->blocks.size(), costs.blocks.size());
  EXPECT_EQ(loaded->blocks[3].name, costs.blocks[3].name);
  EXPECT_DOUBLE_EQ(loaded->blocks[3].backward.per_sample_s, 0.020);
  EXPECT_DOUBLE_EQ(loaded->machine.optimizer_s_per_parameter, 2.5e-9);
  CostKey other_version = key(), other_machine = key(), other_threads = key();
  other_version.version = "0.0.1";
  other_machine.machine = "another host";
  other_threads.threads = 2;
  EXPECT_FALSE(load_costs(dir, other_version).has_value());
  EXPECT_FALSE(load_costs(dir, other_machine).has_value());
  EXPECT_FALSE(load_costs(dir, other_threads).has_value());
  // Another image size or model is another file, and has none yet.
  CostKey other_size = key(), other_model = key();
  other_size.image_size = 128;
  other_model.model = "unet-resnet34";
  EXPECT_NE(cost_file(dir, other_size), cost_file(dir, key()));
  EXPECT_FALSE(load_costs(dir, other_size).has_value());
  EXPECT_FALSE(load_costs(dir, other_model).has_value());
  // A file that is not costs is measured anew, not a failure.
  std::ofstream(cost_file(dir, key())) << "{\"key\": 3";
  EXPECT_FALSE(load_costs(dir, key()).has_value());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ferry::trainer
