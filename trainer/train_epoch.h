// One epoch of training as the master drives it: each batch split over the replicas, forward
// and distributed backward (plain or pipelined) in an autograd context per replica, and the
// optimizer's step or accumulation. Used from the master's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "ferry/data/dataset.h"
#include "ferry/dist_autograd/lr_schedule.h"
#include "ferry/trainer/train.h"
#include "trainer/stages_on_workers.h"

namespace ferry::trainer {

// Optimizer steps in an epoch of `batches`: the last may sum fewer than --accumulate batches.
inline std::size_t steps_per_epoch(std::size_t batches, int accumulate) {
  return (batches + accumulate - 1) / accumulate;
}

// Where an epoch's time went, as the master saw it.
struct EpochTimes {
  double train_s = 0;      // in steps: forward, backward and the optimizer
  double optimizer_s = 0;  // in the optimizer's calls (with replicas, their all-reduce too)
  double data_wait_s = 0;  // waiting for batches the loader had not built yet (not in train_s)
  std::size_t batches = 0;
  int64_t images = 0;
  std::uint64_t bytes_sent = 0;  // by every process of the job
  // The share of the steps' time spent waiting for data.
  double data_wait_share() const {
    return train_s + data_wait_s > 0 ? data_wait_s / (train_s + data_wait_s) : 0;
  }
};

// Called after each optimizer step with the epoch's batches done so far; it may move the stages
// (replace `job`), and the epoch goes on with the new ones.
using AfterStep = std::function<void(std::size_t batches_done)>;

// One pass over the training set. Each batch's gradients are kept on the owners until
// --accumulate of them are summed into one optimizer step, its learning rate the schedule's at
// `step` (counted on). Sets job->last_train_loss.
EpochTimes train_epoch(std::unique_ptr<StagesOnWorkers>& job, data::BatchLoader& loader, int epoch,
                       const TrainSettings& s, const dist_autograd::LrSchedule& schedule,
                       std::int64_t& step, const AfterStep& after_step = {});

}  // namespace ferry::trainer
