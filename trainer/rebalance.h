// Re-cutting a running job from what its stages measured. Blocks are timed once, in one process,
// before training (block_costs.h); a stage's real compute differs (its threads, the cores it
// shares, its micro-batches). Each stage's measured compute per step calibrates its blocks' costs
// (their shares within the stage stay the estimate's), the min-max cut of the calibrated costs is
// the proposal, and the job moves to it when its slowest stage is at least kMinGain faster: the
// stages are built on the same workers with the new ranges, and every parameter, buffer and
// optimizer state goes to its new stage by tensor name, as a resume onto another cut restores
// them, without a checkpoint on disk: worker to worker, or through the master when the handover
// would not fit the memory budget (move_stages, trainer/stages_on_workers.h). Pure functions,
// but for measured_block_s, which asks the stages.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ferry/pipeline/partition.h"
#include "trainer/stage_plan.h"

namespace ferry::trainer {

constexpr double kMinGain = 0.05;       // a move must shorten the slowest stage by this share
constexpr double kMaxImbalance = 1.10;  // after the first check, only beyond this slowest/fastest

// Each block's cost scaled by its stage's measured over estimated compute (`ranges` are the
// stages; a stage that measured nothing keeps its estimate).
std::vector<double> calibrated_block_s(const std::vector<double>& block_s,
                                       const std::vector<pipeline::Range>& ranges,
                                       const std::vector<double>& measured);

// A proposed cut. Value type.
struct Recut {
  std::vector<pipeline::Range> ranges;
  std::vector<double> predicted_s;  // each stage's compute per step on the new cut
  double slowest_s = 0;             // the slowest stage as measured on the current cut
  double predicted_slowest_s = 0;
  bool moves(const std::vector<pipeline::Range>& current) const { return ranges != current; }
  bool worth_it() const { return predicted_slowest_s <= (1 - kMinGain) * slowest_s; }
};

// The cut `ranges` judged by `calibrated` against the stages' `measured` compute.
Recut recut_of(std::vector<pipeline::Range> ranges, const std::vector<double>& calibrated,
               const std::vector<double>& measured);

// The min-max cut of `calibrated` into as many stages as `measured` has, ties broken by `memory`
// (each block's bytes, as the plan counts them; may be empty).
Recut propose_recut(const std::vector<double>& calibrated, const std::vector<double>& measured,
                    const std::vector<double>& memory = {});

// The slowest stage's compute over the fastest's.
double imbalance(const std::vector<double>& measured);

// "stage0 stem..layer4.1 -> stem..layer3.1, stage1 decoder.0..head -> layer4.0..head": the
// stages whose blocks change.
std::string describe_move(const StagePlan& from, const StagePlan& to);

// Each worker's tensor memory budget in MiB, by the place of its stages ("worker2",
// "worker2/cuda:0"): the same for every worker, or each its own. 0: none. Value type.
struct WorkerBudgets {
  WorkerBudgets(double every_mib = 0) : every(every_mib) {}  // NOLINT: one budget is a budget
  double every = 0;
  std::map<std::string, double> by_worker;  // where they differ: by worker name
  double of(const std::string& place) const;
};

// Why `plan` cannot run under `budgets` ("" if it can, or no budget): the stages whose estimated
// peak, with the others on their worker, exceeds their worker's.
std::string over_budget(const StagePlan& plan, const std::vector<std::string>& places,
                        const WorkerBudgets& budgets);

// Every block's forward and backward so far as `stages` timed them (RemoteModule::block_seconds),
// stage by stage: one call to each. Empty if a stage does not time its blocks.
std::vector<double> measured_block_s(const std::vector<remote_module::RemoteModule>& stages);

// Why handing the state of `from`'s stages to `to`'s worker to worker would not fit `budgets`
// ("" if it would, or no budget). While it runs, a worker holds its old
// stages' parameters and optimizer state (`state_copies` per parameter byte) beside its new
// stages' (and, for a moment, the old state a second time, serialised to travel).
std::string handover_over_budget(const StagePlan& from, const StagePlan& to,
                                 const std::vector<std::string>& places, double state_copies,
                                 const WorkerBudgets& budgets);

}  // namespace ferry::trainer
