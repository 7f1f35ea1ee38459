#include "trainer/stage_compute.h"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>

namespace ferry::trainer {
namespace {

// The plan's compute per step as stage_seconds counts it: in plain steps, a stage's worker's
// stages summed.
std::vector<double> estimated_compute_s(const StagePlan& plan,
                                        const std::vector<std::string>& places, bool per_worker) {
  std::vector<double> out;
  for (const PlannedStage& stage : plan.stages) out.push_back(stage.compute_s);
  return per_worker ? summed_by_worker(out, places) : out;
}

// Estimated against measured compute per step, a row per stage.
std::string compute_table(const StagePlan& plan, const std::vector<std::string>& places,
                          const std::vector<double>& estimated,
                          const std::vector<double>& measured) {
  std::string out = fmt::format("{:<8} {:<10} {:>16} {:>19} {:>14}\n", "stage", "worker",
                                "est. compute s", "measured compute s", "measured/est.");
  for (size_t k = 0; k < plan.stages.size() && k < measured.size(); ++k) {
    out += fmt::format("{:<8} {:<10} {:>16.3f} {:>19.3f} {:>14.2f}\n", plan.stages[k].name,
                       places.at(k), estimated.at(k), measured[k],
                       estimated[k] > 0 ? measured[k] / estimated[k] : 0.0);
  }
  return out;
}

}  // namespace

std::vector<double> StageCompute::add_epoch(int epoch, std::size_t batches,
                                            const StageSeconds& before, const StageSeconds& after,
                                            const StagePlan& plan,
                                            const std::vector<std::string>& places) {
  const StageSeconds each = per_batch(before, after, batches);
  const std::vector<double>& per_step = each.compute;
  per_worker_ = after.per_worker;
  block_seconds_.resize(each.blocks.size());
  for (std::size_t k = 0; k < each.blocks.size(); ++k)
    block_seconds_[k] += each.blocks[k] * batches;
  if (show_next_) {
    show_next_ = false;
    std::cerr << fmt::format(
        "stage compute per step in epoch {}, estimated and measured:\n{}", epoch,
        compute_table(plan, places, estimated_compute_s(plan, places, per_worker_), per_step));
  }
  seconds_.resize(per_step.size());
  for (std::size_t k = 0; k < per_step.size(); ++k) seconds_[k] += per_step[k] * batches;
  batches_ += batches;
  return per_step;
}

void StageCompute::restart_on_new_cut() {
  seconds_.clear();
  block_seconds_.clear();
  batches_ = 0;
  show_next_ = true;
  moved_ = true;
}

void StageCompute::report(const StagePlan& plan, const std::vector<std::string>& places,
                          const std::vector<double>& estimated_blocks,
                          std::vector<StageRecord>& stages,
                          std::vector<BlockRecord>& blocks) const {
  const std::vector<double> estimated = estimated_compute_s(plan, places, per_worker_);
  const auto batches = static_cast<double>(std::max<std::size_t>(batches_, 1));
  std::vector<double> measured;
  for (double seconds : seconds_) measured.push_back(seconds / batches);
  blocks.clear();
  for (std::size_t k = 0; k < block_seconds_.size() && k < plan.costs.size(); ++k) {
    blocks.push_back({plan.costs[k].name, estimated_blocks.at(k), block_seconds_[k] / batches});
  }
  for (std::size_t k = 0; k < plan.stages.size() && k < stages.size(); ++k) {
    stages[k].estimated_compute_s = estimated[k];
    if (k < measured.size()) stages[k].measured_compute_s = measured[k];
  }
  if (measured.empty()) return;
  std::cerr << fmt::format("\ncompute per step over the run{}, estimated and measured{}:\n{}",
                           moved_ ? " since the last move" : "",
                           per_worker_ ? " (per worker: all the stages it hosts)" : "",
                           compute_table(plan, places, estimated, measured));
}

}  // namespace ferry::trainer
