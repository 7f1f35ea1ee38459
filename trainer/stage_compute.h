// Each stage's measured compute per step over a run (replica 0's, as stage_seconds counts it)
// beside the plan's estimate: shown after the first epoch and after a move, kept for the end of
// the run and its metrics. Resource type, used from the master's thread.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "trainer/run_report.h"
#include "trainer/stage_plan.h"
#include "trainer/train_report.h"

namespace ferry::trainer {

class StageCompute {
 public:
  // The epoch's compute per step of each stage (`batches` steps between `before` and `after`).
  // The first epoch, and the first after a move, is printed against `plan` (stages at `places`).
  std::vector<double> add_epoch(int epoch, std::size_t batches, const StageSeconds& before,
                                const StageSeconds& after, const StagePlan& plan,
                                const std::vector<std::string>& places);

  // After a move to another cut: the next epoch is shown, and the run's figures start again,
  // so that the end of the run compares the cut it ends with.
  void restart_on_new_cut();

  // Each stage's estimated and measured compute per step over the run into `stages` (one per
  // stage of `plan`), and the table of them; each block's, as its stage timed it, beside
  // `estimated_blocks` into `blocks` (none when the stages do not time their blocks).
  void report(const StagePlan& plan, const std::vector<std::string>& places,
              const std::vector<double>& estimated_blocks, std::vector<StageRecord>& stages,
              std::vector<BlockRecord>& blocks) const;

 private:
  std::vector<double> seconds_;        // per stage, summed over the run's epochs
  std::vector<double> block_seconds_;  // per block of the model, the same
  std::size_t batches_ = 0;
  bool per_worker_ = false;  // plain steps: a worker's figures stand for each stage it hosts
  bool show_next_ = true;
  bool moved_ = false;
};

}  // namespace ferry::trainer
