// When a training job re-cuts and where to (trainer/rebalance.h): with --rebalance on
// pipelined steps, the cut its stages' measured compute calls for when it shortens the slowest
// stage by kMinGain and its estimated peaks fit the memory budget; --rebalance-to's cut at the
// first look. The first look comes after --rebalance-after batches of the first epoch (the first
// step, warming up, not measured), or after that epoch when it is shorter; later ones after
// epochs whose stages measured out of balance. Each decision is logged and recorded; the move
// itself is move_stages (trainer/stages_on_workers.h), worker to worker unless that would not fit
// the budget. Resource type, used from the master's thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "ferry/trainer/train.h"
#include "trainer/run_report.h"
#include "trainer/stage_plan.h"
#include "trainer/stages_on_workers.h"

namespace ferry::trainer {

// Where in the run a look happens: after epoch `epoch`, or within it after `batch` batches.
struct RebalanceMoment {
  int epoch = 0;
  std::size_t batch = 0;         // 0: after the epoch
  std::string describe() const;  // "after epoch 2", "in epoch 1 after batch 5"
};

struct StageMove {
  StagePlan to;
  Handover handover = Handover::WorkerToWorker;
};

class EpochRebalance {
 public:
  // `plan_settings`: those `plan` was made with. Fails naming --rebalance-to when its cut does
  // not fit `plan`, so that before training.
  EpochRebalance(const TrainSettings& s, PlanSettings plan_settings, const StagePlan& plan);

  // The batch of an epoch of `batches` after which the first look happens within it (the step
  // that ends there or after it); 0 when it happens after an epoch.
  std::size_t first_look_within(bool pipelined, std::size_t batches) const;

  // The move to make at `when`, if any, for a job whose stages (at `places`) measured
  // `measured` compute per batch since the last look (or warm-up), and its blocks
  // `measured_blocks` (empty when the stages do not time their blocks: the plan's estimates
  // then stand in, scaled to what their stage measured). Each decision goes into `records`.
  std::optional<StageMove> look(const RebalanceMoment& when, bool pipelined, const StagePlan& plan,
                                const std::vector<std::string>& places,
                                const std::vector<double>& measured,
                                const std::vector<double>& measured_blocks,
                                std::vector<RebalanceRecord>& records);

 private:
  // Whether the job looks for a better cut after its epochs (--rebalance).
  bool looks(bool pipelined) const;

  const TrainSettings& s_;
  PlanSettings plan_settings_;
  std::vector<pipeline::Range> forced_;  // --rebalance-to's ranges
  int checks_ = 0;
};

}  // namespace ferry::trainer
