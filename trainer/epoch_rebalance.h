// When a training job re-cuts after an epoch and where to (ferry/trainer/rebalance.h): with
// --rebalance on pipelined steps, the cut its stages' measured compute calls for when it
// shortens the slowest stage by kMinGain and its estimated peaks fit the memory budget;
// --rebalance-to's cut after the first epoch. Each decision is logged and recorded; the move
// itself is move_stages (trainer/stages_on_workers.h). Resource type, used from the master's
// thread.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ferry/trainer/stage_plan.h"
#include "ferry/trainer/train.h"

namespace ferry::trainer {

class EpochRebalance {
 public:
  // `plan_settings`: those `plan` was made with. Fails naming --rebalance-to when its cut does
  // not fit `plan`, so that before training.
  EpochRebalance(const TrainSettings& s, PlanSettings plan_settings, const StagePlan& plan);

  // The plan to move to after `epoch`, if any, for a job whose stages (at `places`) measured
  // `measured` compute per step over it. Each decision goes into `records` (the metrics'
  // "rebalances").
  std::optional<StagePlan> after_epoch(int epoch, bool pipelined, const StagePlan& plan,
                                       const std::vector<std::string>& places,
                                       const std::vector<double>& measured,
                                       nlohmann::ordered_json& records);

 private:
  // Whether the job looks for a better cut after its epochs (--rebalance).
  bool looks(bool pipelined) const;

  const TrainSettings& s_;
  PlanSettings plan_settings_;
  std::vector<pipeline::Range> forced_;  // --rebalance-to's ranges
  int checks_ = 0;
};

}  // namespace ferry::trainer
