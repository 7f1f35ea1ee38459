// What the training job shows while and after it trains: a progress bar per epoch and the
// end-of-run table of where each stage's time and memory went. Used from the master's thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "ferry/dist_autograd/optimizer.h"
#include "ferry/models/remote_unet.h"
#include "ferry/pipeline/pipeline.h"
#include "trainer/epoch_monitor.h"
#include "trainer/replicas.h"
#include "trainer/run_report.h"
#include "trainer/stage_plan.h"

namespace ferry::trainer {

// One line per pass ("epoch 2/5", "predict"), redrawn in place on a terminal and printed every
// tenth otherwise: the bar, the steps done, `figures` ("loss 0.31 20.5 img/s") and the time left.
class ProgressBar {
 public:
  using Clock = std::chrono::steady_clock;
  ProgressBar(std::string title, std::size_t steps);
  void update(std::size_t step, const std::string& figures);

 private:
  std::string title_;
  std::size_t steps_;
  bool tty_;
  Clock::time_point start_;
};

// Per stage: its worker, parameters, forward and backward seconds, the network's share, how long
// its worker idled over `train_s` seconds of training, and its worker's peaks. `direct`: the
// activations went stage to stage.
void print_stage_table(const models::RemoteUnet& split, double train_s, bool direct);

// Seconds each stage has worked so far, per stage of `replica`. In pipelined steps, its own
// forwards and backwards (compute) and those with its sends (busy), from the timeline; in plain
// steps, the forward of every stage its worker hosts and that worker's backward (both). The
// difference over an epoch, divided by its training time, is the busy share.
struct StageSeconds {
  std::vector<double> compute, busy;
  bool per_worker = false;  // plain steps: a worker's figures stand for each stage it hosts
  // Each block of the model, forward and backward, as its stage timed it (Stage::block_seconds);
  // empty when a stage does not time its blocks.
  std::vector<double> blocks;
};
// What each stage and block computed per batch from `from` to `to`, `batches` batches apart.
StageSeconds per_batch(const StageSeconds& from, const StageSeconds& to, std::size_t batches);
StageSeconds stage_seconds(const Replica& replica);

// The end of a run by the monitored metric: which epoch was best, where its checkpoint is (the
// latest in `best_dir`; empty: none was kept), whether the run stopped early after epoch
// `stopped_after` (0: it did not). Printed and returned; nullopt before any epoch was observed.
std::optional<BestRecord> report_best(const EpochMonitor& monitor, const std::string& best_dir,
                                      int stopped_after);

// With replicas: how each owner's gradient buckets went.
std::vector<BucketRecord> bucket_records(const dist_autograd::DistributedOptimizer& optimizer);

// The pipeline's timeline and activation peaks (printed), its schedule and bubble (returned), and
// the Chrome trace to `trace_file` (--trace; empty: none).
PipelineRecord report_pipeline(pipeline::Pipeline& pipe, const StagePlan& plan,
                               const std::string& trace_file);

// "background 0.970, ellipse 0.810, ...": each of `names`' classes with its figure in `values`.
std::string per_class(const std::vector<std::string>& names, const std::vector<double>& values);
// Each class's IoU and Dice by name, NaN for a class found nowhere.
std::vector<ClassFigures> class_figures(const std::vector<std::string>& names, const Validation& v);

// The last validation's IoU and Dice of each of `names`' classes, and their means, as a table.
std::string class_table(const std::vector<std::string>& names, const Validation& v);

}  // namespace ferry::trainer
