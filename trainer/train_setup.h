// What the training job makes of its settings before it trains: the data sets, the cut, the
// optimizer, the learning-rate schedule, the monitor of the best epoch and the pipeline. Each
// fails with rpc::Error(InvalidArgument) naming the flag that is wrong. Used from the master's
// thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ferry/data/dataset.h"
#include "ferry/dist_autograd/lr_schedule.h"
#include "ferry/dist_autograd/optimizer.h"
#include "ferry/models/remote_unet.h"
#include "ferry/pipeline/pipeline.h"
#include "ferry/remote_module/precision.h"
#include "ferry/trainer/train.h"
#include "trainer/epoch_monitor.h"
#include "trainer/stage_plan.h"

namespace ferry::trainer {

// The images a run trains on and those it validates on, with the indices of each it uses: the
// last share of --data's images (the same images, augmented only for training), or all of
// --val-data's.
struct DataSplit {
  std::shared_ptr<const data::Dataset> train, validation;
  std::vector<std::size_t> train_indices, validation_indices;
};
DataSplit datasets_of(const TrainSettings& s);

// How the masks read: the classes and the ignore index.
data::MaskLabels labels_of(const TrainSettings& s);
// What training draws anew for each folder image (--augment).
data::Augmentation augmentation_of(const TrainSettings& s);
// How the images are normalised (--normalize).
data::Normalization normalization_of(const TrainSettings& s);

// The names of the classes the metrics count (two with one class: background and foreground):
// --class-names, else DIR/classes.txt beside a folder's images, else the synthetic set's, else
// class0, class1, ...
std::vector<std::string> class_names_of(const TrainSettings& s);

// The loss as it travels to the stage that computes it (remote_module::LossSpec's text): --loss
// (bce+dice with one class, ce+dice with more, when empty) with the ignore index and class
// weights.
std::string loss_spec(const TrainSettings& s);

dist_autograd::OptimizerSpec optimizer_spec(const TrainSettings& s);

// The pipeline the settings ask for over a replica's stages, or none for plain steps.
std::unique_ptr<pipeline::Pipeline> pipeline_of(const TrainSettings& s,
                                                const models::RemoteUnet& split);

// The plan's settings as the run's schedule makes them: micro-batches, samples in flight,
// recomputation.
PlanSettings plan_settings_of(const TrainSettings& s);

// Whether the last stage computes the loss (--loss-on; auto: in pipelined steps only; never
// with --via-master).
bool loss_on_last_stage(const TrainSettings& s, bool pipelined);

// The cut the settings ask for, measured in this process before any stage is built.
StagePlan plan_of(const TrainSettings& s);

// The learning rate of each of the run's `total_steps` optimizer steps.
dist_autograd::LrSchedule schedule_of(const TrainSettings& s, std::int64_t total_steps);

// Fails on --sync-batchnorm with settings it cannot work with.
void check_sync_batchnorm(const TrainSettings& s);

// Settings that cannot work, refused before any data is read or any worker builds a stage.
void check_settings(const TrainSettings& s);

// The monitor the settings ask for, if any; fails on settings that cannot work together.
std::optional<EpochMonitor> monitor_of(const TrainSettings& s);

}  // namespace ferry::trainer
