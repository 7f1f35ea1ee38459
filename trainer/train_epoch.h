// One epoch of training as the master drives it, in ranges of batches: each batch split over the
// replicas, forward and distributed backward (plain or pipelined) in an autograd context per
// replica, and the optimizer's step or accumulation. Used from the master's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ferry/data/dataset.h"
#include "ferry/dist_autograd/lr_schedule.h"
#include "ferry/trainer/train.h"
#include "trainer/stages_on_workers.h"
#include "trainer/train_report.h"

namespace ferry::trainer {

// Optimizer steps in an epoch of `batches`: the last may sum fewer than --accumulate batches.
inline std::size_t steps_per_epoch(std::size_t batches, int accumulate) {
  return (batches + accumulate - 1) / accumulate;
}

// Where an epoch's time went, as the master saw it, and its training loss.
struct EpochTimes {
  double train_s = 0;      // in steps: forward, backward and the optimizer
  double optimizer_s = 0;  // in the optimizer's calls (with replicas, their all-reduce too)
  double data_wait_s = 0;  // waiting for batches the loader had not built yet (not in train_s)
  std::size_t batches = 0;
  int64_t images = 0;
  std::uint64_t bytes_sent = 0;  // by every process of the job
  double train_loss = 0;         // the mean of its batches' losses
  // The share of the steps' time spent waiting for data.
  double data_wait_share() const {
    return train_s + data_wait_s > 0 ? data_wait_s / (train_s + data_wait_s) : 0;
  }
};

// One epoch in progress, trained in ranges of batches: between two ranges the caller may look at
// the stages and move them (a new StagesOnWorkers), and the next range trains the job it is
// given. Keeps the loader's place, the running figures and the progress bar across ranges.
// Resource type; used from the master's thread.
class EpochPass {
 public:
  // Where an optimizer step left the epoch.
  struct StepEnd {
    std::int64_t step;      // steps done
    std::size_t batch;      // the epoch's batches done
    double loss;            // the step's (the mean of its batches')
    double epoch_loss_sum;  // of the epoch's batches done
  };
  // Called after each optimizer step, before the next batch.
  using StepDone = std::function<void(const StepEnd&)>;

  // Starts epoch `epoch` of `loader` (reshuffled) for the job of `s`, at batch `first_batch`
  // (one that begins an optimizer step) with `loss_sum` the losses of the batches before it.
  EpochPass(data::BatchLoader& loader, int epoch, const TrainSettings& s,
            const StagesOnWorkers& job, std::size_t first_batch = 0, double loss_sum = 0,
            StepDone step_done = {});

  // Trains the epoch's next batches on `job` until at least `batches` of it are done and the
  // last of them ended an optimizer step, or the epoch is over. Each batch's gradients are kept
  // on the owners until --accumulate of them are summed into one optimizer step, its learning
  // rate the schedule's at `step` (counted on). False once the epoch has no batch left.
  bool train_until(std::size_t batches, StagesOnWorkers& job,
                   const dist_autograd::LrSchedule& schedule, std::int64_t& step);
  // The epoch's batches done so far (those before its first batch too).
  std::size_t done() const { return index_; }
  // Their losses' sum.
  double loss_sum() const { return loss_sum_; }
  // The epoch's figures so far (all of them, once train_until said it is over): its loss over
  // every batch done, its times and counts over those this pass trained; no bytes_sent, which
  // the workers are asked for.
  EpochTimes times() const;
  // The bytes `job`'s processes have sent since the pass started.
  std::uint64_t bytes_sent(const StagesOnWorkers& job) const;

 private:
  data::BatchLoader& loader_;
  const TrainSettings& s_;
  std::string loss_name_;
  ProgressBar bar_;
  EpochTimes times_;
  double waited_before_;
  std::uint64_t bytes_before_;
  std::size_t first_;
  std::size_t index_;
  double loss_sum_;
  StepDone step_done_;
  double rate_ = 0;
  double step_loss_ = 0;    // of the batches of the step in progress
  bool ended_step_ = true;  // the last batch ended an optimizer step
};

}  // namespace ferry::trainer
