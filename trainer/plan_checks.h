// Which candidates of a plan are checked with real steps, and what a failed check leads to: a
// candidate that runs out of memory at its predicted batch is tried at smaller batches, halving
// the gap between the largest that passed and the smallest that failed; only a candidate that
// passed can be the winner. Pure logic over a check function, which the plan command runs as a
// short job on a local world and the tests fake.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trainer/planner.h"

namespace ferry::trainer {

// What the real steps of one candidate at its batch found. Value type.
struct StepCheck {
  bool out_of_memory = false;
  std::string error;  // why it failed; empty when it passed
  double images_per_s = -1;
  std::vector<double> peak_mib;  // per stage
  StepTerms terms;               // the measured step's; step_s 0 where it was not read
  bool passed() const { return error.empty(); }
};

using CheckCandidate = std::function<StepCheck(const Candidate&)>;

// The costs a candidate is scored from again at a batch it is moved to.
struct PlanCosts {
  const std::vector<models::BlockCost>& blocks;
  const MachineCosts& machine;
};

// How many candidates to check. Value type.
struct CheckBudget {
  int passed = 3;      // stop once this many passed (0: check none)
  int candidates = 6;  // try at most this many of the ranked list
  // Real steps one candidate's back-off may take besides its first (largest_batch only).
  int backoff_steps = 4;
};

// The largest batch per replica below `failed`, and at least `lowest`, at which `check` passes,
// by bisection after a first try at `first_try` x `failed` (where the estimates are thought to
// hold, 7/8 of it before anything is known): within
// max(1, failed / 32) images of the largest that passes, in at most `max_steps` checks (about
// log2(failed / that) + 1, more where nothing passes near `failed`). Leaves
// `c` at that batch, scored again from `costs`, with its check recorded and
// `c.predicted_batch_size` the batch it came with; leaves it failed (its last error) when none
// passed. A failure other than running out of memory ends the search.
void back_off(Candidate& c, int64_t failed, int64_t lowest, double first_try, int max_steps,
              const PlanCosts& costs, const PlanRequest& request, const CheckCandidate& check);

// Checks candidates in their ranked order (and, for a fixed batch, the one-process one, which a
// plan must beat), backing off by measurement where a largest-batch candidate runs out of
// memory, then moves those that passed to the front, best measured first: with
// `largest_batch`, the largest batch, then the most images per second. Returns how many passed.
int check_candidates(std::vector<Candidate>& candidates, const PlanCosts& costs,
                     const PlanRequest& request, const CheckCandidate& check,
                     const CheckBudget& budget);

}  // namespace ferry::trainer
