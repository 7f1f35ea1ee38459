// A training run on the master, as its pieces share it (train.cc runs it, train_recovery.cc saves
// it and brings it back after a lost worker). Used from the master's thread.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/data/dataset.h"
#include "ferry/dist_autograd/lr_schedule.h"
#include "ferry/remote_module/checkpoint.h"
#include "ferry/remote_module/checkpoint_writer.h"
#include "ferry/rpc/error.h"
#include "ferry/trainer/train.h"
#include "trainer/epoch_rebalance.h"
#include "trainer/event_log.h"
#include "trainer/metrics_log.h"
#include "trainer/run_report.h"
#include "trainer/stage_compute.h"
#include "trainer/stage_plan.h"
#include "trainer/stages_on_workers.h"
#include "trainer/train_epoch.h"
#include "trainer/train_setup.h"

namespace ferry::trainer {

// An epoch's steps, trained: what its record and its re-balance need.
struct EpochTrained {
  int epoch = 0;
  EpochTimes times;
  StageSeconds before, after;  // replica 0's stages at the first and the last measured step
  std::size_t batches = 0;     // measured between the two
};

// A run on the master: what it set up before its first epoch and what it keeps between epochs.
// Resource type.
struct Run {
  explicit Run(const TrainSettings& settings) : s(settings) {}

  const TrainSettings& s;
  std::unique_ptr<data::BatchLoader> train_loader, validation_loader;
  std::size_t epoch_steps = 0;  // optimizer steps per epoch
  std::optional<dist_autograd::LrSchedule> schedule;
  StagePlan plan;
  // Every copy of every stage, replica by replica: its name and its worker's place.
  std::vector<std::string> stage_names, workers;
  std::vector<std::string> spares;
  std::unique_ptr<StagesOnWorkers> job;
  Progress progress;
  // Between an epoch's last step and its end: a lost worker's stages rebuilt from the surviving
  // replicas go on to validate the epoch without training its steps again.
  std::optional<EpochTrained> trained;
  std::optional<MetricsLog> metrics_log;
  RunReport report;  // --metrics-file
  double train_s = 0;
  double data_wait_s = 0;  // of the training steps, waiting for the loader
  StageCompute compute;
  std::optional<EpochRebalance> rebalance;
  int takeovers = 0;
  int stopped_after = 0;  // the epoch early stopping ended the run after, if it did
  std::optional<Validation> last_validation;
  std::vector<std::string> class_names;  // as the metrics name the classes
  // Declared before the writer, whose thread adds to it until the writer is gone.
  std::unique_ptr<EventLog> events;
  // With --checkpoint-dir. A lost worker's stages are restored from the last checkpoint it has
  // brought here, without waiting for the disk or reading it back.
  std::unique_ptr<remote_module::CheckpointWriter> writer;
};

// CHECKPOINT_DIR/best, where --save-best keeps the best epoch's checkpoint.
std::string best_dir(const TrainSettings& s);

// Where the run stands, as the log says it: "after epoch 2", "after batch 40 of 100 of epoch 3".
std::string where_in_training(const Run& run);

// The state at this moment into the background writer: the checkpoint's (and the best one's,
// when `improved`). What is copied here is all the step waits for.
void save_checkpoints(Run& run, bool improved = false);

// After an optimizer step within epoch `epoch`: its event, and the step's checkpoint every
// --checkpoint-every-steps (not at the epoch's end, which has its own).
void step_done(Run& run, int epoch, const EpochPass::StepEnd& end);

// After a lost worker (e): spares take over its stages and every stage is rebuilt. With replicas,
// each takes its state from a copy that survived at the step the run had reached, and the
// interrupted step runs again; where that cannot be (no replicas, or no copy of some stage left
// as it was after the step), training goes back to the last checkpoint (of an epoch or, with
// --checkpoint-every-steps, of a step). Rethrows `e`, with what the user needs to know, when no
// spare can.
void take_over(Run& run, const rpc::Error& e);

}  // namespace ferry::trainer
