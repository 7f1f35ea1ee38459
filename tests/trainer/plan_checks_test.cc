// Which candidates a plan checks and what a failed check leads to, with a fake check in place of
// real steps: a failed candidate is never the winner, and a candidate that runs out of memory
// at its estimated batch backs off to the largest that passes.
#include "trainer/plan_checks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "ferry/models/unet_blocks.h"

namespace ferry::trainer {
namespace {

using ::testing::AllOf;
using ::testing::Ge;
using ::testing::Le;

std::vector<models::BlockCost> alike_light_blocks() {
  std::vector<models::BlockCost> out;
  for (const models::UnetBlock& b : models::unet_blocks(18)) {
    models::BlockCost c;
    c.name = b.name;
    c.parameters = 1 << 20;
    c.parameter_bytes = 4 << 20;
    c.largest_parameter_bytes = 1 << 19;
    c.activation_bytes_per_sample = 1 << 18;
    c.output_bytes_per_sample = 1 << 16;
    c.carry_bytes_per_sample = 1 << 16;
    c.forward = {0.001, 0.001};
    c.backward = {0.001, 0.002};
    out.push_back(c);
  }
  return out;
}

MachineCosts machine() {
  MachineCosts m;
  m.cores = 4;
  m.link_bytes_per_s = 1e12;
  return m;
}

PlanRequest largest_batch_request() {
  PlanRequest r;
  r.model = "unet-resnet18";
  r.image_size = 64;
  r.workers = 3;
  r.budget_mib = 300;
  r.largest_batch = true;
  r.batch_size = 0;
  r.max_batch = 4096;
  return r;
}

StepCheck passes(double images_per_s) {
  StepCheck out;
  out.images_per_s = images_per_s;
  out.peak_mib = {1, 2};
  return out;
}

StepCheck out_of_memory() {
  StepCheck out;
  out.out_of_memory = true;
  out.error = "out of memory under the budget";
  return out;
}

class PlanChecks : public ::testing::Test {
 protected:
  std::vector<models::BlockCost> blocks_ = alike_light_blocks();
  MachineCosts machine_ = machine();
  PlanCosts costs_{blocks_, machine_};
};

TEST_F(PlanChecks, ACandidateThatFailedItsCheckIsNeverTheWinner) {
  PlanRequest request = largest_batch_request();
  request.largest_batch = false;
  request.batch_size = 64;
  for (int failing = 0; failing <= 4; ++failing) {
    std::vector<Candidate> candidates = plan_candidates(blocks_, machine_, request);
    ASSERT_GE(candidates.size(), 6u);
    const std::vector<Candidate> ranked = candidates;
    int calls = 0;
    const int passed = check_candidates(candidates, costs_, request,
                                        [&](const Candidate&) {
                                          StepCheck failed;
                                          failed.error = "exit 1: a fake launcher's failure";
                                          return ++calls <= failing ? failed : passes(10.0 + calls);
                                        },
                                        {2, 6, 6});
    ASSERT_GT(passed, 0) << failing << " failing";
    EXPECT_TRUE(candidates.front().verified()) << failing << " failing";
    EXPECT_TRUE(candidates.front().verify_error.empty());
    for (const Candidate& c : candidates) {
      if (!c.verify_error.empty()) {
        EXPECT_FALSE(c.verified());
      }
    }
    // The best measured of those that passed leads.
    for (const Candidate& c : candidates) {
      if (c.verified()) {
        EXPECT_LE(c.measured_images_per_s, candidates.front().measured_images_per_s);
      }
    }
  }
}

TEST_F(PlanChecks, WhenEveryCheckFailsNoneCountsAsPassed) {
  PlanRequest request = largest_batch_request();
  std::vector<Candidate> candidates = plan_candidates(blocks_, machine_, request);
  int calls = 0;
  const int passed = check_candidates(candidates, costs_, request,
                                      [&](const Candidate&) {
                                        ++calls;
                                        return out_of_memory();
                                      },
                                      {3, 4, 5});
  EXPECT_EQ(passed, 0);
  EXPECT_FALSE(candidates.front().verified());
  EXPECT_FALSE(candidates.front().verify_error.empty());
  // Four candidates, each its first check and at most five more while backing off.
  EXPECT_THAT(calls, AllOf(Ge(4), Le(4 * 6)));
}

// Each candidate fits 60% of its estimated batch: the first backs off from 7/8 down, the next
// ones first try where the first ended, and each of the three passes.
TEST_F(PlanChecks, ALaterBackOffStartsWhereTheFirstEnded) {
  const PlanRequest request = largest_batch_request();
  std::vector<Candidate> candidates = plan_candidates(blocks_, machine_, request);
  std::map<int64_t, int64_t> estimated;  // by the candidate's rank
  for (size_t k = 0; k < candidates.size(); ++k) {
    candidates[k].microbatches = static_cast<int>(k) + 1;  // tells the calls apart
    estimated[static_cast<int64_t>(k) + 1] = candidates[k].batch_size;
  }
  std::map<int64_t, std::vector<int64_t>> tried;
  const int passed = check_candidates(candidates, costs_, request,
                                      [&](const Candidate& c) {
                                        tried[c.microbatches].push_back(c.batch_size);
                                        return c.batch_size * 10 <= estimated[c.microbatches] * 6
                                                   ? passes(static_cast<double>(c.batch_size))
                                                   : out_of_memory();
                                      },
                                      {3, 3, 4});
  EXPECT_EQ(passed, 3);
  ASSERT_EQ(tried.size(), 3u);
  for (auto& [rank, batches] : tried) {
    ASSERT_GE(batches.size(), 2u) << "candidate " << rank;
    EXPECT_EQ(batches[0], estimated[rank]);
  }
  EXPECT_EQ(tried[1][1], estimated[1] * 7 / 8);
  for (int64_t rank : {2, 3}) {
    EXPECT_LT(tried[rank][1], estimated[rank] * 7 / 8);
    EXPECT_GE(tried[rank][1], estimated[rank] / 2);
  }
}

TEST_F(PlanChecks, BackingOffFindsTheLargestBatchThatPassesWithinItsTolerance) {
  const PlanRequest request = largest_batch_request();
  Candidate shape = plan_candidates(blocks_, machine_, request).front();
  for (const int64_t failed : {40, 300, 1376, 2016}) {
    for (const int64_t limit : {failed - 1, failed * 9 / 10, failed * 3 / 4, failed / 3, 8L}) {
      Candidate c = shape;
      c.batch_size = failed;
      c.verify_error = "out of memory under the budget";
      int calls = 0;
      back_off(c, failed, 4, 7.0 / 8, 12, costs_, request, [&](const Candidate& at) {
        ++calls;
        return at.batch_size <= limit ? passes(static_cast<double>(at.batch_size))
                                      : out_of_memory();
      });
      const int64_t tolerance = std::max<int64_t>(1, failed / 32);
      ASSERT_TRUE(c.verified()) << "failed at " << failed << ", limit " << limit;
      EXPECT_THAT(c.batch_size, AllOf(Le(limit), Ge(limit - tolerance)))
          << "failed at " << failed << ", limit " << limit << ", " << calls << " checks";
      EXPECT_EQ(c.predicted_batch_size, failed);
      EXPECT_DOUBLE_EQ(c.measured_images_per_s, static_cast<double>(c.batch_size));
      EXPECT_LE(calls, 12);
    }
  }
}

TEST_F(PlanChecks, BackingOffRescoresTheCandidateAtTheBatchItFound) {
  const PlanRequest request = largest_batch_request();
  Candidate c = plan_candidates(blocks_, machine_, request).front();
  const int64_t failed = c.batch_size;
  const double estimated_peak = c.predicted_largest_peak_mib();
  back_off(c, failed, 1, 7.0 / 8, 12, costs_, request, [&](const Candidate& at) {
    return at.batch_size <= failed / 2 ? passes(1) : out_of_memory();
  });
  ASSERT_TRUE(c.verified());
  EXPECT_LT(c.predicted_largest_peak_mib(), estimated_peak);
}

TEST_F(PlanChecks, AFailureOtherThanMemoryEndsTheBackOff) {
  const PlanRequest request = largest_batch_request();
  Candidate c = plan_candidates(blocks_, machine_, request).front();
  int calls = 0;
  back_off(c, 1000, 1, 7.0 / 8, 12, costs_, request, [&](const Candidate&) {
    ++calls;
    StepCheck broken;
    broken.error = "exit 1: a worker could not start";
    return broken;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(c.verified());
  EXPECT_EQ(c.verify_error, "exit 1: a worker could not start");
}

TEST_F(PlanChecks, NothingBelowTheLowestBatchIsTried) {
  const PlanRequest request = largest_batch_request();
  Candidate c = plan_candidates(blocks_, machine_, request).front();
  std::vector<int64_t> tried;
  back_off(c, 64, 32, 7.0 / 8, 12, costs_, request, [&](const Candidate& at) {
    tried.push_back(at.batch_size);
    return out_of_memory();
  });
  EXPECT_FALSE(c.verified());
  ASSERT_FALSE(tried.empty());
  EXPECT_GE(*std::min_element(tried.begin(), tried.end()), 32);
}

}  // namespace
}  // namespace ferry::trainer
