#include "trainer/plan_checks.h"

#include <algorithm>

namespace ferry::trainer {
namespace {

void record(Candidate& c, const StepCheck& check) {
  if (check.passed()) {
    c.verify_error.clear();
    c.measured_images_per_s = check.images_per_s;
    c.measured_peak_mib = check.peak_mib;
    c.measured_terms = check.terms;
  } else {
    c.verify_error = check.error;
    c.measured_images_per_s = -1;
    c.measured_peak_mib.clear();
    c.measured_terms = StepTerms{};
  }
}

bool one_process(const Candidate& c) { return c.stages == 1 && c.replicas == 1 && !c.schedule; }

}  // namespace

void back_off(Candidate& c, int64_t failed, int64_t lowest, double first_try, int max_steps,
              const PlanCosts& costs, const PlanRequest& request, const CheckCandidate& check) {
  const int64_t tolerance = std::max<int64_t>(1, failed / 32);
  int64_t good = 0, bad = failed;
  Candidate best = c;
  StepCheck last;
  last.error = c.verify_error;
  last.out_of_memory = true;
  auto searching = [&] { return good == 0 ? bad > lowest : bad - good > tolerance; };
  for (int k = 0; k < max_steps && searching(); ++k) {
    int64_t next = k == 0 ? static_cast<int64_t>(static_cast<double>(failed) * first_try)
                          : good + (bad - good) / 2;
    next = std::max(next, lowest);
    if (next >= bad || next <= good) break;
    Candidate at = c;
    at.batch_size = next;
    score_candidate(costs.blocks, costs.machine, request, at);
    last = check(at);
    if (last.passed()) {
      good = next;
      best = at;
      record(best, last);
    } else if (last.out_of_memory) {
      bad = next;
    } else {
      break;
    }
  }
  if (good == 0) {
    record(c, last);
  } else {
    c = best;
  }
  c.predicted_batch_size = failed;
}

int check_candidates(std::vector<Candidate>& candidates, const PlanCosts& costs,
                     const PlanRequest& request, const CheckCandidate& check,
                     const CheckBudget& budget) {
  if (budget.passed <= 0) return 0;
  int passed = 0;
  // The estimates of one plan err alike: the next back-off first tries where the last one ended.
  double first_try = 7.0 / 8;
  const size_t tries = std::min(candidates.size(), static_cast<size_t>(budget.candidates));
  for (size_t k = 0; k < tries && passed < budget.passed; ++k) {
    Candidate& c = candidates[k];
    const StepCheck first = check(c);
    record(c, first);
    if (!first.passed() && first.out_of_memory && request.largest_batch) {
      back_off(c, c.batch_size, std::max(c.microbatches, 1), first_try, budget.backoff_steps, costs,
               request, check);
      if (c.verified()) {
        first_try = std::min(first_try, static_cast<double>(c.batch_size) /
                                            static_cast<double>(c.predicted_batch_size));
      }
    }
    if (c.verified()) ++passed;
  }
  auto single = std::find_if(candidates.begin(), candidates.end(), one_process);
  if (!request.largest_batch && single != candidates.end() && !single->verified() &&
      single->verify_error.empty()) {
    record(*single, check(*single));
    if (single->verified()) ++passed;
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](const Candidate& a, const Candidate& b) {
                     if (a.verified() != b.verified()) return a.verified();
                     if (!a.verified()) return false;
                     if (request.largest_batch && a.global_batch() != b.global_batch()) {
                       return a.global_batch() > b.global_batch();
                     }
                     return a.measured_images_per_s > b.measured_images_per_s;
                   });
  return passed;
}

}  // namespace ferry::trainer
