#include "trainer/train_setup.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "ferry/core/log.h"
#include "ferry/core/process_memory.h"
#include "ferry/remote_module/loss.h"
#include "ferry/rpc/error.h"
#include "ferry/trainer/fail.h"

namespace ferry::trainer {

// The training and validation views of the data: the same images, augmented only for training.
std::pair<std::shared_ptr<const data::Dataset>, std::shared_ptr<const data::Dataset>> datasets_of(
    const TrainSettings& s) {
  if (s.data == "synthetic") {
    auto set = std::make_shared<data::SyntheticDataset>(s.samples, s.plan.image_size, s.seed);
    return {set, set};
  }
  data::FolderDataset::Options options;
  options.image_size = s.plan.image_size;
  options.crop = s.crop;
  options.seed = s.seed;
  auto validation = std::make_shared<data::FolderDataset>(s.data, options);
  options.augment = true;
  auto train = std::make_shared<data::FolderDataset>(s.data, options);
  log::info("data: {} image/mask pairs from {}", train->size(), s.data);
  return {train, validation};
}

dist_autograd::OptimizerSpec optimizer_spec(const TrainSettings& s) {
  if (s.plan.optimizer == "sgd") return dist_autograd::OptimizerSpec::sgd(s.lr, 0.9, 1e-4);
  if (s.plan.optimizer == "adam") return dist_autograd::OptimizerSpec::adam(s.lr);
  if (s.plan.optimizer == "adamw") return dist_autograd::OptimizerSpec::adamw(s.lr);
  fail(fmt::format("--optimizer must be sgd, adam or adamw, not \"{}\"", s.plan.optimizer));
}

void check_sync_batchnorm(const TrainSettings& s) {
  if (!s.sync_batchnorm) return;
  if (s.freeze_batchnorm) {
    fail(
        "--sync-batchnorm with --freeze-batchnorm: frozen batch norms take no batch statistics "
        "to synchronise");
  }
  if (s.via_master) {
    fail("--sync-batchnorm needs pipelined steps; --via-master (the naive split) is not");
  }
  bool interleaved = false;
  try {
    interleaved =
        !s.pipeline.empty() && pipeline::parse_schedule(s.pipeline) != pipeline::Schedule::GPipe;
  } catch (const std::invalid_argument&) {
    // pipeline_of says what is wrong with it.
  }
  if (s.replicas > 1 && interleaved) {
    fail(fmt::format(
        "--sync-batchnorm with --replicas and --pipeline {0}: under {0} a stage's forwards "
        "and backwards interleave differently in each replica, and the replicas' batch norms "
        "must sum their statistics in the same order; use --pipeline gpipe",
        s.pipeline));
  }
}

// The pipeline the settings ask for, or none for plain steps.
std::unique_ptr<pipeline::Pipeline> pipeline_of(const TrainSettings& s,
                                                const models::RemoteUnet& split) {
  // --sync-batchnorm: a pipelined stage runs each micro-batch's backward at once, in order, on
  // one thread, so every replica's batch norms sum in the same order.
  bool wanted = !s.pipeline.empty() || s.microbatches > 1 || s.checkpoint_activations ||
                !s.trace_file.empty() || s.sync_batchnorm;
  if (!wanted) return nullptr;
  if (s.via_master) fail("--via-master is the naive split; it cannot be pipelined");
  pipeline::PipelineOptions options;
  try {
    options.schedule = pipeline::parse_schedule(s.pipeline.empty() ? "gpipe" : s.pipeline);
  } catch (const std::invalid_argument& e) {
    fail(fmt::format("--pipeline: {}", e.what()));
  }
  options.microbatches = s.microbatches;
  if (s.microbatches > s.plan.batch_size) {
    fail(fmt::format("--microbatches {} is more than the {} images of a batch", s.microbatches,
                     s.plan.batch_size));
  }
  if (s.checkpoint_activations) {
    for (size_t k = 0; k < split.stages().size(); ++k) {
      options.checkpoint_stages.push_back(static_cast<int>(k));
    }
  }
  for (const models::RemoteUnet::Stage& stage : split.stages())
    options.stage_names.push_back(stage.name());
  options.routes = split.routes();
  if (loss_on_last_stage(s, /*pipelined=*/true)) options.loss = s.loss;
  std::vector<remote_module::RemoteModule> stages = split.modules();
  log::info("pipelined steps: {}, {} micro-batches of {} images{}, the loss on the {}",
            pipeline::schedule_name(options.schedule), options.microbatches,
            s.plan.batch_size / options.microbatches,
            s.checkpoint_activations ? ", activations recomputed in backward" : "",
            options.loss.empty() ? "master" : "last stage");
  return std::make_unique<pipeline::Pipeline>(std::move(stages), options);
}

bool loss_on_last_stage(const TrainSettings& s, bool pipelined) {
  return !s.via_master && (s.loss_on == "last-stage" || (s.loss_on == "auto" && pipelined));
}

PlanSettings plan_settings_of(const TrainSettings& s) {
  PlanSettings p = s.plan;
  int stages = s.plan.stages > 0 ? s.plan.stages : 3;
  if (!s.plan.partition.empty()) {
    // The first block of each stage after the first: one stage more than the names.
    stages =
        2 + static_cast<int>(std::count(s.plan.partition.begin(), s.plan.partition.end(), ','));
  }
  p.in_flight_samples = in_flight_samples(s.plan.batch_size, s.microbatches,
                                          s.pipeline == "1f1b" || s.pipeline == "zb", stages);
  p.microbatches = s.microbatches;
  p.recompute = s.checkpoint_activations;
  return p;
}

StagePlan plan_of(const TrainSettings& s) {
  const PlanSettings p = plan_settings_of(s);
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
    return dist_autograd::LrSchedule::parse(s.lr_schedule, s.lr, total_steps, s.warmup_steps,
                                            s.lr_step_size, s.lr_gamma);
  } catch (const std::invalid_argument& e) {
    fail(fmt::format("--lr-schedule: {}", e.what()));
  }
}

// The monitor the settings ask for, if any; fails on settings that cannot work together.
std::optional<EpochMonitor> monitor_of(const TrainSettings& s) {
  if (s.save_best && s.checkpoint_dir.empty()) {
    fail("--save-best needs --checkpoint-dir: the best epoch's checkpoint goes to its best/");
  }
  if (s.monitor.empty() && !s.save_best && s.early_stop_patience == 0) return std::nullopt;
  try {
    return EpochMonitor(s.monitor.empty() ? "val_loss" : s.monitor, s.early_stop_patience);
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
}

remote_module::Precision precision_of(const TrainSettings& s) {
  try {
    return remote_module::parse_precision(s.precision);
  } catch (const std::invalid_argument& e) {
    fail(fmt::format("--precision: {}", e.what()));
  }
}

void check_settings(const TrainSettings& s) {
  depth_of(s.plan.model);
  // Validation computes the loss here too, so the master must know it, whichever rank trains it.
  try {
    remote_module::loss_function(s.loss);
  } catch (const rpc::Error& e) {
    fail(fmt::format("--loss: {} (a loss of your own comes with --plugin)", e.what()));
  }
  if (s.loss_on != "auto" && s.loss_on != "last-stage" && s.loss_on != "master") {
    fail(fmt::format("--loss-on must be auto, last-stage or master, not \"{}\"", s.loss_on));
  }
  if (s.accumulate < 1) fail(fmt::format("--accumulate must be 1 or more, not {}", s.accumulate));
  if (s.replicas < 1) fail(fmt::format("--replicas must be 1 or more, not {}", s.replicas));
  precision_of(s);
  check_sync_batchnorm(s);
}

}  // namespace ferry::trainer
