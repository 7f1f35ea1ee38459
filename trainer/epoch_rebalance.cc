#include "trainer/epoch_rebalance.h"

#include <fmt/format.h>

#include "ferry/core/log.h"
#include "ferry/core/process_memory.h"
#include "ferry/trainer/fail.h"
#include "ferry/trainer/rebalance.h"

namespace ferry::trainer {

EpochRebalance::EpochRebalance(const TrainSettings& s, PlanSettings plan_settings,
                               const StagePlan& plan)
    : s_(s), plan_settings_(std::move(plan_settings)) {
  if (s.rebalance_to.empty()) return;
  forced_ = ranges_at_cuts(plan.costs, "--rebalance-to", s.rebalance_to);
  if (forced_.size() != plan.stages.size()) {
    fail(fmt::format("--rebalance-to {} makes {} stages but the job has {}", s.rebalance_to,
                     forced_.size(), plan.stages.size()));
  }
}

bool EpochRebalance::looks(bool pipelined) const {
  if (!pipelined || s_.rebalance == "off") return false;
  return s_.rebalance == "on" ||
         (s_.plan.balance == "time" && s_.plan.stages > 0 && s_.plan.partition.empty());
}

std::optional<StagePlan> EpochRebalance::after_epoch(int epoch, bool pipelined,
                                                     const StagePlan& plan,
                                                     const std::vector<std::string>& places,
                                                     const std::vector<double>& measured,
                                                     nlohmann::ordered_json& records) {
  const bool forced = !forced_.empty() && checks_ == 0;
  if (!forced && !looks(pipelined)) return std::nullopt;
  if (!forced && checks_ > 0 && imbalance(measured) <= kMaxImbalance) return std::nullopt;
  ++checks_;
  const std::vector<pipeline::Range> current = plan.ranges();
  const std::vector<double> calibrated = calibrated_block_s(
      block_compute_s(plan, s_.plan.batch_size, s_.microbatches, s_.checkpoint_activations),
      current, measured);
  const Recut proposal =
      forced ? recut_of(forced_, calibrated, measured) : propose_recut(calibrated, measured);
  nlohmann::ordered_json record{{"after_epoch", epoch},
                                {"measured_slowest_s", proposal.slowest_s},
                                {"predicted_slowest_s", proposal.predicted_slowest_s}};
  auto keep = [&](const std::string& why) -> std::optional<StagePlan> {
    record["moved"] = false;
    record["why_not"] = why;
    records.push_back(record);
    return std::nullopt;
  };
  if (!proposal.moves(current) || (!forced && !proposal.worth_it())) {
    log::info(
        "re-balance after epoch {}: the cut stays (its slowest stage computes {:.3f} s per "
        "step; the best cut from the measured compute, {:.3f} s)",
        epoch, proposal.slowest_s, proposal.predicted_slowest_s);
    return keep(proposal.moves(current) ? "the step would not get 5% shorter"
                                        : "the best cut is the one the job has");
  }
  StagePlan to = recut(plan, plan_settings_, proposal.ranges,
                       forced ? "moved by --rebalance-to" : "re-balanced from measured compute");
  const std::string over = over_budget(to, places, core::tensor_memory_budget() / double(1 << 20));
  const std::string move = describe_move(plan, to);
  record["blocks"] = move;
  if (!over.empty()) {
    log::warn("re-balance after epoch {} not made ({}): {}; training goes on with the cut it has",
              epoch, move, over);
    return keep(over);
  }
  log::info(
      "re-balance after epoch {}: {}; slowest stage {:.3f} s per step measured, {:.3f} s "
      "predicted",
      epoch, move, proposal.slowest_s, proposal.predicted_slowest_s);
  record["moved"] = true;
  records.push_back(record);
  return to;
}

}  // namespace ferry::trainer
