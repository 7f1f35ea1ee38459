#include "trainer/rebalance.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

namespace ferry::trainer {

std::vector<double> calibrated_block_s(const std::vector<double>& block_s,
                                       const std::vector<pipeline::Range>& ranges,
                                       const std::vector<double>& measured) {
  std::vector<double> out = block_s;
  const std::vector<double> estimated = pipeline::range_costs(block_s, ranges);
  for (size_t k = 0; k < ranges.size() && k < measured.size(); ++k) {
    if (estimated[k] <= 0 || measured[k] <= 0) continue;
    const double factor = measured[k] / estimated[k];
    for (int64_t b = ranges[k].begin; b < ranges[k].end; ++b) out[b] *= factor;
  }
  return out;
}

Recut recut_of(std::vector<pipeline::Range> ranges, const std::vector<double>& calibrated,
               const std::vector<double>& measured) {
  Recut recut;
  recut.ranges = std::move(ranges);
  recut.predicted_s = pipeline::range_costs(calibrated, recut.ranges);
  recut.slowest_s = *std::max_element(measured.begin(), measured.end());
  recut.predicted_slowest_s = *std::max_element(recut.predicted_s.begin(), recut.predicted_s.end());
  return recut;
}

Recut propose_recut(const std::vector<double>& calibrated, const std::vector<double>& measured,
                    const std::vector<double>& memory) {
  return recut_of(
      pipeline::partition_min_max(calibrated, static_cast<int64_t>(measured.size()), memory),
      calibrated, measured);
}

double imbalance(const std::vector<double>& measured) {
  const auto [fastest, slowest] = std::minmax_element(measured.begin(), measured.end());
  return *fastest > 0 ? *slowest / *fastest : 0;
}

std::string describe_move(const StagePlan& from, const StagePlan& to) {
  std::vector<std::string> moved;
  for (size_t k = 0; k < from.stages.size() && k < to.stages.size(); ++k) {
    if (from.stages[k].blocks == to.stages[k].blocks) continue;
    moved.push_back(fmt::format("{} {} -> {}", from.stages[k].name, from.stages[k].blocks,
                                to.stages[k].blocks));
  }
  return fmt::format("{}", fmt::join(moved, ", "));
}

double WorkerBudgets::of(const std::string& place) const {
  const auto it = by_worker.find(worker_of(place));
  return it == by_worker.end() ? every : it->second;
}

namespace {

// "a; b, over the budget of 120 MiB per process", or with budgets per worker each item with its
// own ("a, over its worker's budget of 120 MiB; b, ...").
std::string over_text(const std::vector<std::string>& over, const std::vector<double>& budgets,
                      const WorkerBudgets& all) {
  if (over.empty()) return "";
  if (all.by_worker.empty()) {
    return fmt::format("{}, over the budget of {:.0f} MiB per process", fmt::join(over, "; "),
                       all.every);
  }
  std::vector<std::string> each;
  for (std::size_t k = 0; k < over.size(); ++k) {
    each.push_back(fmt::format("{}, over its worker's budget of {:.0f} MiB", over[k], budgets[k]));
  }
  return fmt::format("{}", fmt::join(each, "; "));
}

}  // namespace

std::string over_budget(const StagePlan& plan, const std::vector<std::string>& places,
                        const WorkerBudgets& budgets) {
  std::vector<double> peaks;
  for (const PlannedStage& stage : plan.stages) peaks.push_back(stage.peak_mib);
  peaks = summed_by_worker(peaks, places);
  std::vector<std::string> over;
  std::vector<double> bounds;
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    const double budget = budgets.of(places[k]);
    if (budget <= 0 || peaks[k] <= budget) continue;
    over.push_back(fmt::format("{} ({}) on {} would peak at an estimated {:.0f} MiB",
                               plan.stages[k].name, plan.stages[k].blocks, places[k], peaks[k]));
    bounds.push_back(budget);
  }
  return over_text(over, bounds, budgets);
}

std::vector<double> measured_block_s(const std::vector<remote_module::RemoteModule>& stages) {
  std::vector<double> out;
  for (const remote_module::RemoteModule& stage : stages) {
    const std::vector<remote_module::BlockSeconds> blocks = stage.block_seconds();
    if (blocks.empty()) return {};
    for (const remote_module::BlockSeconds& b : blocks) out.push_back(b.forward_s + b.backward_s);
  }
  return out;
}

std::string handover_over_budget(const StagePlan& from, const StagePlan& to,
                                 const std::vector<std::string>& places, double state_copies,
                                 const WorkerBudgets& budgets) {
  auto state_mib = [&](const StagePlan& plan, double copies) {
    std::vector<double> out;
    for (const PlannedStage& stage : plan.stages) {
      out.push_back(static_cast<double>(stage.parameters) * sizeof(float) * (1 + copies) /
                    (1 << 20));
    }
    return summed_by_worker(out, places);
  };
  const std::vector<double> parked = state_mib(from, 2 * state_copies);
  const std::vector<double> old_state = state_mib(from, state_copies);
  const std::vector<double> new_state = state_mib(to, state_copies);
  std::vector<std::string> over;
  std::vector<double> bounds;
  std::set<std::string> said;
  for (size_t k = 0; k < places.size() && k < to.stages.size(); ++k) {
    const double held = std::max(parked[k], old_state[k] + new_state[k]);
    const double budget = budgets.of(places[k]);
    if (budget <= 0 || held <= budget || !said.insert(places[k]).second) continue;
    over.push_back(fmt::format("{} would hold an estimated {:.0f} MiB", places[k], held));
    bounds.push_back(budget);
  }
  return over_text(over, bounds, budgets);
}

}  // namespace ferry::trainer
