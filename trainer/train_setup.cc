#include "trainer/train_setup.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "ferry/core/files.h"
#include "ferry/core/log.h"
#include "ferry/core/process_memory.h"
#include "ferry/remote_module/loss.h"
#include "ferry/rpc/error.h"

namespace ferry::trainer {

DataSplit datasets_of(const TrainSettings& s) {
  data::FolderDataset::Options options;
  options.image_size = s.plan.image_size;
  options.resize = s.resize;
  options.crop = s.crop;
  options.seed = s.seed;
  options.labels = labels_of(s);
  DataSplit split;
  if (s.data_dir.empty()) {
    split.train = split.validation = std::make_shared<data::SyntheticDataset>(
        s.samples, s.plan.image_size, s.seed, s.plan.classes);
  } else {
    split.validation = std::make_shared<data::FolderDataset>(s.data_dir, options);
    data::FolderDataset::Options augmented = options;
    augmented.augment = augmentation_of(s);
    split.train = std::make_shared<data::FolderDataset>(s.data_dir, augmented);
    log::info("data: {} image/mask pairs from {}", split.train->size(), s.data_dir);
  }
  const data::Normalization normalization = normalization_of(s);
  split.train = data::normalized(split.train, normalization);
  split.validation =
      s.data_dir.empty() ? split.train : data::normalized(split.validation, normalization);
  if (s.val_data.empty()) {
    std::tie(split.train_indices, split.validation_indices) =
        data::split_indices(split.train->size(), s.validation_share);
    return split;
  }
  split.validation =
      data::normalized(std::make_shared<data::FolderDataset>(s.val_data, options), normalization);
  log::info("validation: {} image/mask pairs from {}", split.validation->size(), s.val_data);
  split.train_indices = data::split_indices(split.train->size(), 0).first;
  split.validation_indices = data::split_indices(split.validation->size(), 1).second;
  return split;
}

data::MaskLabels labels_of(const TrainSettings& s) { return {s.plan.classes, s.ignore_index}; }

data::Augmentation augmentation_of(const TrainSettings& s) {
  try {
    return data::Augmentation::parse(s.augment);
  } catch (const std::invalid_argument& e) {
    rpc::refuse(e.what());
  }
}

data::Normalization normalization_of(const TrainSettings& s) {
  try {
    return data::Normalization::parse(s.normalize);
  } catch (const std::invalid_argument& e) {
    rpc::refuse(e.what());
  }
}

namespace {

// DIR/classes.txt: a name a line, blank lines left out; empty if there is no such file.
std::vector<std::string> class_file_names(const std::string& dir) {
  const std::filesystem::path path = std::filesystem::path(dir) / "classes.txt";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return {};
  std::vector<std::string> names;
  std::istringstream lines(core::read_whole_file(path.string()));
  for (std::string line; std::getline(lines, line);) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    names.push_back(line.substr(first, line.find_last_not_of(" \t\r") + 1 - first));
  }
  return names;
}

}  // namespace

std::vector<std::string> class_names_of(const TrainSettings& s) {
  const std::int64_t counted = std::max<std::int64_t>(s.plan.classes, 2);
  std::string source = "--class-names";
  std::vector<std::string> names = s.class_names;
  if (names.empty() && !s.data_dir.empty()) {
    names = class_file_names(s.data_dir);
    source = (std::filesystem::path(s.data_dir) / "classes.txt").string();
  }
  if (names.empty()) {
    if (s.data_dir.empty()) return data::synthetic_class_names(s.plan.classes);
    if (s.plan.classes == 1) return {"background", "foreground"};
    for (std::int64_t k = 0; k < counted; ++k) names.push_back(fmt::format("class{}", k));
    return names;
  }
  if (static_cast<std::int64_t>(names.size()) != counted) {
    rpc::refuse(fmt::format("{} names {} classes, but --classes {} {}", source, names.size(),
                            s.plan.classes,
                            s.plan.classes == 1 ? "counts 2 (background and foreground)"
                                                : fmt::format("counts {}", counted)));
  }
  for (const std::string& name : names) {
    if (name.empty() || name.find_first_of(",\"") != std::string::npos) {
      rpc::refuse(fmt::format(
          "{}: the class name \"{}\" must be non-empty, without commas or quotes", source, name));
    }
  }
  return names;
}

std::string loss_spec(const TrainSettings& s) {
  remote_module::LossSpec spec;
  spec.name = !s.loss.empty() ? s.loss : s.plan.classes > 1 ? "ce+dice" : "bce+dice";
  spec.options.ignore_index = s.ignore_index;
  spec.options.class_weights = s.class_weights;
  return spec.to_string();
}

dist_autograd::OptimizerSpec optimizer_spec(const TrainSettings& s) {
  switch (s.plan.optimizer) {
    case Optimizer::Sgd:
      return dist_autograd::OptimizerSpec::sgd(s.lr, 0.9, 1e-4);
    case Optimizer::AdamW:
      return dist_autograd::OptimizerSpec::adamw(s.lr);
    case Optimizer::Adam:
      break;
  }
  return dist_autograd::OptimizerSpec::adam(s.lr);
}

void check_sync_batchnorm(const TrainSettings& s) {
  if (!s.sync_batchnorm) return;
  if (s.freeze_batchnorm) {
    rpc::refuse(
        "--sync-batchnorm with --freeze-batchnorm: frozen batch norms take no batch statistics "
        "to synchronise");
  }
  if (s.via_master) {
    rpc::refuse("--sync-batchnorm needs pipelined steps; --via-master (the naive split) is not");
  }
  const bool interleaved = s.pipeline && *s.pipeline != pipeline::Schedule::GPipe;
  if (s.replicas > 1 && interleaved) {
    rpc::refuse(fmt::format(
        "--sync-batchnorm with --replicas and --pipeline {0}: under {0} a stage's forwards "
        "and backwards interleave differently in each replica, and the replicas' batch norms "
        "must sum their statistics in the same order; use --pipeline gpipe",
        pipeline::schedule_name(*s.pipeline)));
  }
}

// The pipeline the settings ask for, or none for plain steps.
std::unique_ptr<pipeline::Pipeline> pipeline_of(const TrainSettings& s,
                                                const models::RemoteUnet& split) {
  // --sync-batchnorm: a pipelined stage runs each micro-batch's backward at once, in order, on
  // one thread, so every replica's batch norms sum in the same order.
  bool wanted = s.pipeline || s.microbatches > 1 || s.checkpoint_activations ||
                !s.trace_file.empty() || s.sync_batchnorm;
  if (!wanted) return nullptr;
  if (s.via_master) rpc::refuse("--via-master is the naive split; it cannot be pipelined");
  pipeline::PipelineOptions options;
  options.schedule = s.pipeline.value_or(pipeline::Schedule::GPipe);
  options.microbatches = s.microbatches;
  if (s.microbatches > s.plan.batch_size) {
    rpc::refuse(fmt::format("--microbatches {} is more than the {} images of a batch",
                            s.microbatches, s.plan.batch_size));
  }
  if (s.checkpoint_activations) {
    for (size_t k = 0; k < split.stages().size(); ++k) {
      options.checkpoint_stages.push_back(static_cast<int>(k));
    }
  }
  for (const models::RemoteUnet::Stage& stage : split.stages())
    options.stage_names.push_back(stage.name());
  options.routes = split.routes();
  if (loss_on_last_stage(s, /*pipelined=*/true)) options.loss = loss_spec(s);
  std::vector<remote_module::RemoteModule> stages = split.modules();
  log::info("pipelined steps: {}, {} micro-batches of {} images{}, the loss on the {}",
            pipeline::schedule_name(options.schedule), options.microbatches,
            s.plan.batch_size / options.microbatches,
            s.checkpoint_activations ? ", activations recomputed in backward" : "",
            options.loss.empty() ? "master" : "last stage");
  return std::make_unique<pipeline::Pipeline>(std::move(stages), options);
}

bool loss_on_last_stage(const TrainSettings& s, bool pipelined) {
  return !s.via_master &&
         (s.loss_on == LossPlacement::LastStage || (s.loss_on == LossPlacement::Auto && pipelined));
}

PlanSettings plan_settings_of(const TrainSettings& s) {
  PlanSettings p = s.plan;
  int stages = s.plan.stages > 0 ? s.plan.stages : 3;
  if (!s.plan.partition.empty()) {
    // The first block of each stage after the first: one stage more than the names.
    stages =
        2 + static_cast<int>(std::count(s.plan.partition.begin(), s.plan.partition.end(), ','));
  }
  // The zero-bubble schedule's last stage holds a micro-batch whose weight pass waits besides
  // the one in flight: as many as a stage of two stages before it.
  const bool zero_bubble = s.pipeline == pipeline::Schedule::ZeroBubble;
  p.in_flight_samples = in_flight_samples(s.plan.batch_size, s.microbatches,
                                          s.pipeline == pipeline::Schedule::OneFOneB || zero_bubble,
                                          zero_bubble ? std::max(stages, 2) : stages);
  p.deferred_samples = 0;
  for (int stage = 0; zero_bubble && stage < stages; ++stage) {
    p.deferred_samples = std::max(
        p.deferred_samples, deferred_samples(s.plan.batch_size, s.microbatches, stages, stage));
  }
  p.microbatches = s.microbatches;
  p.recompute = s.checkpoint_activations;
  return p;
}

StagePlan plan_of(const TrainSettings& s) {
  const PlanSettings p = plan_settings_of(s);
  if (!s.planned_costs.empty()) return plan_stages_from(p, s.planned_costs);
  // The blocks are measured here, all in this process: no stage's budget applies to that.
  const std::int64_t budget = core::tensor_memory_budget();
  core::set_tensor_memory_budget(0);
  try {
    StagePlan plan = plan_stages(p);
    core::set_tensor_memory_budget(budget);
    return plan;
  } catch (...) {
    core::set_tensor_memory_budget(budget);
    throw;
  }
}

dist_autograd::LrSchedule schedule_of(const TrainSettings& s, std::int64_t total_steps) {
  try {
    return dist_autograd::LrSchedule::of(s.lr_schedule, s.lr, total_steps, s.warmup_steps,
                                         s.lr_step_size, s.lr_gamma);
  } catch (const std::invalid_argument& e) {
    rpc::refuse(fmt::format("--lr-schedule: {}", e.what()));
  }
}

// The monitor the settings ask for, if any; fails on settings that cannot work together.
std::optional<EpochMonitor> monitor_of(const TrainSettings& s) {
  if (s.save_best && s.checkpoint_dir.empty()) {
    rpc::refuse(
        "--save-best needs --checkpoint-dir: the best epoch's checkpoint goes to its best/");
  }
  if (!s.monitor && !s.save_best && s.early_stop_patience == 0) return std::nullopt;
  return EpochMonitor(s.monitor.value_or(Monitor::ValLoss), s.early_stop_patience);
}

namespace {

// The classes, the loss and the labels agree.
void check_classes(const TrainSettings& s) {
  const std::int64_t k = s.plan.classes;
  const std::string name = remote_module::LossSpec::parse(loss_spec(s)).name;
  if (k > 1 && (name == "bce" || name == "bce+dice")) {
    rpc::refuse(
        fmt::format("--loss {} compares one logit per pixel with masks of 0 and 1; with "
                    "--classes {} use ce, dice, focal or ce+dice",
                    name, k));
  }
  if (k == 1 && (name == "ce" || name == "ce+dice")) {
    rpc::refuse(
        fmt::format("--loss {} needs --classes 2 or more; with one class use bce, dice, focal "
                    "or bce+dice",
                    name));
  }
  if (!s.class_weights.empty() && static_cast<std::int64_t>(s.class_weights.size()) != k) {
    rpc::refuse(
        fmt::format("--class-weights has {} values for --classes {}", s.class_weights.size(), k));
  }
  for (double w : s.class_weights) {
    if (!(w >= 0)) rpc::refuse(fmt::format("--class-weights must be 0 or more, not {}", w));
  }
  if (s.ignore_index && *s.ignore_index >= 0 && *s.ignore_index < std::max<std::int64_t>(k, 2)) {
    rpc::refuse(fmt::format("--ignore-index {} is the id of one of the classes (0 to {})",
                            *s.ignore_index, std::max<std::int64_t>(k, 2) - 1));
  }
  if (s.data_dir.empty()) {
    try {
      data::SyntheticDataset(0, s.plan.image_size, s.seed, k);
    } catch (const std::invalid_argument& e) {
      rpc::refuse(e.what());
    }
  }
  class_names_of(s);
}

}  // namespace

void check_settings(const TrainSettings& s) {
  depth_of(s.plan.model);
  // Validation computes the loss here too, so the master must know it, whichever rank trains it.
  try {
    remote_module::loss_function(loss_spec(s));
  } catch (const rpc::Error& e) {
    const std::vector<std::string> known = remote_module::registered_losses();
    const bool registered = std::find(known.begin(), known.end(), s.loss) != known.end();
    rpc::refuse(fmt::format(
        "--loss: {}{}", e.what(),
        registered || s.loss.empty() ? "" : " (a loss of your own comes with --plugin)"));
  }
  check_classes(s);
  normalization_of(s);
  augmentation_of(s);
  if (s.accumulate < 1)
    rpc::refuse(fmt::format("--accumulate must be 1 or more, not {}", s.accumulate));
  if (s.replicas < 1) rpc::refuse(fmt::format("--replicas must be 1 or more, not {}", s.replicas));
  check_sync_batchnorm(s);
  if (s.checkpoint_every_steps < 0) {
    rpc::refuse(fmt::format("--checkpoint-every-steps must be 0 or more, not {}",
                            s.checkpoint_every_steps));
  }
  if (s.checkpoint_every_steps > 0 && s.checkpoint_dir.empty()) {
    rpc::refuse("--checkpoint-every-steps needs --checkpoint-dir");
  }
  if (s.keep_checkpoints < 1) {
    rpc::refuse(fmt::format("--keep-checkpoints must be 1 or more, not {}", s.keep_checkpoints));
  }
}

}  // namespace ferry::trainer
