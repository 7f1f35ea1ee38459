#include "trainer/epoch_rebalance.h"

#include <fmt/format.h>

#include <algorithm>

#include "ferry/core/log.h"
#include "ferry/core/process_memory.h"
#include "ferry/rpc/error.h"
#include "trainer/placement.h"
#include "trainer/rebalance.h"

namespace ferry::trainer {
namespace {

// Each worker's budget: --memory-budget-mib's own per worker, else the one every process has
// (this one's).
WorkerBudgets worker_budgets(const TrainSettings& s) {
  if (!s.memory_budget.per_worker()) {
    return WorkerBudgets(static_cast<double>(core::tensor_memory_budget()) / (1 << 20));
  }
  WorkerBudgets out;
  const std::vector<std::string> world = world_names();
  for (std::size_t rank = 1; rank < world.size(); ++rank) {
    out.by_worker[world[rank]] =
        static_cast<double>(s.memory_budget.of_rank(static_cast<int>(rank)));
  }
  return out;
}

}  // namespace

EpochRebalance::EpochRebalance(const TrainSettings& s, PlanSettings plan_settings,
                               const StagePlan& plan)
    : s_(s), plan_settings_(std::move(plan_settings)) {
  if (s.rebalance_to.empty()) return;
  forced_ = ranges_at_cuts(plan.costs, "--rebalance-to", s.rebalance_to);
  if (forced_.size() != plan.stages.size()) {
    rpc::refuse(fmt::format("--rebalance-to {} makes {} stages but the job has {}", s.rebalance_to,
                            forced_.size(), plan.stages.size()));
  }
}

std::string RebalanceMoment::describe() const {
  return batch == 0 ? fmt::format("after epoch {}", epoch)
                    : fmt::format("in epoch {} after batch {}", epoch, batch);
}

std::size_t EpochRebalance::first_look_within(bool pipelined, std::size_t batches) const {
  if (checks_ > 0 || (forced_.empty() && !looks(pipelined))) return 0;
  const auto after = static_cast<std::size_t>(std::max(s_.rebalance_after, 0));
  return after >= 2 && after < batches ? after : 0;
}

bool EpochRebalance::looks(bool pipelined) const {
  if (!pipelined || s_.rebalance == Rebalance::Off) return false;
  return s_.rebalance == Rebalance::On ||
         (s_.plan.balance == Balance::Time && s_.plan.stages > 0 && s_.plan.partition.empty());
}

std::optional<StageMove> EpochRebalance::look(const RebalanceMoment& when, bool pipelined,
                                              const StagePlan& plan,
                                              const std::vector<std::string>& places,
                                              const std::vector<double>& measured,
                                              const std::vector<double>& measured_blocks,
                                              std::vector<RebalanceRecord>& records) {
  const bool forced = !forced_.empty() && checks_ == 0;
  if (!forced && !looks(pipelined)) return std::nullopt;
  if (!forced && checks_ > 0 && imbalance(measured) <= kMaxImbalance) return std::nullopt;
  ++checks_;
  const std::vector<pipeline::Range> current = plan.ranges();
  // The blocks' own times leave out what their stage spends between them (the engine, the
  // carries' copies): scaled to the stage's, as estimates are.
  const bool timed = measured_blocks.size() == plan.costs.size();
  const std::vector<double> calibrated = calibrated_block_s(
      timed ? measured_blocks
            : block_compute_s(plan, s_.plan.batch_size, s_.microbatches, s_.checkpoint_activations),
      current, measured);
  const Recut proposal =
      forced ? recut_of(forced_, calibrated, measured) : propose_recut(calibrated, measured);
  RebalanceRecord record;
  if (when.batch == 0) {
    record.after_epoch = when.epoch;
  } else {
    record.in_epoch = when.epoch;
    record.after_batch = when.batch;
  }
  record.block_costs = timed ? "measured in the stages" : "estimated";
  record.measured_slowest_s = proposal.slowest_s;
  record.predicted_slowest_s = proposal.predicted_slowest_s;
  auto keep = [&](const std::string& why) -> std::optional<StageMove> {
    record.moved = false;
    record.why_not = why;
    records.push_back(record);
    return std::nullopt;
  };
  if (!proposal.moves(current) || (!forced && !proposal.worth_it())) {
    log::info(
        "re-balance {}: the cut stays (its slowest stage computes {:.3f} s per step; the best "
        "cut from the measured compute, {:.3f} s)",
        when.describe(), proposal.slowest_s, proposal.predicted_slowest_s);
    return keep(proposal.moves(current) ? "the step would not get 5% shorter"
                                        : "the best cut is the one the job has");
  }
  StagePlan to = recut(plan, plan_settings_, proposal.ranges,
                       forced ? "moved by --rebalance-to" : "re-balanced from measured compute");
  const WorkerBudgets budgets = worker_budgets(s_);
  const std::string over = over_budget(to, places, budgets);
  const std::string move = describe_move(plan, to);
  record.blocks = move;
  if (!over.empty()) {
    log::warn("re-balance {} not made ({}): {}; training goes on with the cut it has",
              when.describe(), move, over);
    return keep(over);
  }
  log::info("re-balance {}: {}; slowest stage {:.3f} s per step measured, {:.3f} s predicted",
            when.describe(), move, proposal.slowest_s, proposal.predicted_slowest_s);
  const std::string tight = handover_over_budget(
      plan, to, places, optimizer_state_copies(plan_settings_.optimizer), budgets);
  if (!tight.empty()) log::info("the state moves through the master: worker to worker, {}", tight);
  record.moved = true;
  record.handover = tight.empty() ? "worker to worker" : "through the master";
  records.push_back(record);
  return StageMove{std::move(to),
                   tight.empty() ? Handover::WorkerToWorker : Handover::ThroughMaster};
}

}  // namespace ferry::trainer
