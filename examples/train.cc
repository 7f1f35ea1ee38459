// The training loop on the master. Each step: the encoder, decoder and head run one after the
// other on their workers (features go from worker to worker, or through the master with
// --via-master), the loss is computed here, distributed backward runs through all three, and the
// distributed optimizer steps every owner. With --pipeline the batch goes through as micro-batches
// (ferry::Pipeline) and each stage's backward runs per micro-batch instead.
// Times are taken on both sides so that the end-of-run table can say where each stage's time went.
#include "examples/train.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "examples/epoch_monitor.h"
#include "examples/metrics_log.h"
#include "examples/model_tools.h"
#include "examples/placement.h"
#include "examples/replicas.h"
#include "examples/stage_plan.h"
#include "examples/train_report.h"
#include "examples/train_setup.h"
#include "examples/worker_loop.h"
#include "ferry/core/log.h"
#include "ferry/core/process_memory.h"
#include "ferry/data/dataset.h"
#include "ferry/dist_autograd/context.h"
#include "ferry/dist_autograd/lr_schedule.h"
#include "ferry/dist_autograd/optimizer.h"
#include "ferry/models/remote_unet.h"
#include "ferry/models/unet.h"
#include "ferry/models/unet_blocks.h"
#include "ferry/pipeline/pipeline.h"
#include "ferry/remote_module/checkpoint.h"
#include "ferry/remote_module/remote_module.h"
#include "ferry/rpc/rpc.h"

namespace ferry::examples {
namespace {

using Clock = std::chrono::steady_clock;

using models::RemoteUnet;

// Every replica of the model's stages on their workers, with the optimizer over them all: built
// again as a whole when spares take over a lost worker's stages.
struct StagesOnWorkers {
  std::vector<Replica> replicas;
  std::unique_ptr<dist_autograd::DistributedOptimizer> optimizer;
  double last_train_loss = 0;  // mean over the last epoch's steps

  // Replica 0: what checkpoints save and reports show (every replica's parameters are equal).
  RemoteUnet& split() { return replicas.front().split; }
  std::vector<const RemoteUnet*> splits() const {
    std::vector<const RemoteUnet*> out;
    for (const Replica& r : replicas) out.push_back(&r.split);
    return out;
  }
};

// Replica 0's parameters and buffers into every other replica. Their parameters are equal already;
// their batch norms' running statistics are not, each having seen its own images: after this,
// validation and checkpoints see one model, as DistributedDataParallel's broadcast of buffers
// makes it.
void align_replicas(StagesOnWorkers& job) {
  const std::vector<RemoteUnet::Stage>& first = job.replicas.front().split.stages();
  for (std::size_t k = 0; k < first.size(); ++k) {
    const c10::Dict<std::string, at::Tensor> state = first[k].module.state_dict();
    for (std::size_t r = 1; r < job.replicas.size(); ++r) {
      job.replicas[r].split.stages()[k].module.load_state_dict(state);
    }
  }
}

// Loads --weights into a replica's stages, saying what did not fit.
void load_weights(RemoteUnet& split, const TrainSettings& s) {
  models::LoadReport report = split.load_weights(s.weights);
  if (report.loaded == 0) {
    fail_setting(fmt::format("--weights {}: no tensor in it fits the model ({})", s.weights,
                             report.describe()));
  }
  if (report.ok()) {
    log::info("weights loaded from {}", s.weights);
  } else {
    log::warn("weights from {} loaded where they fit; {}", s.weights, report.describe());
  }
}

// --sync-batchnorm: the copies of each stage join a collective group of their own.
void take_step_statistics(const StagesOnWorkers& job) {
  static std::atomic<std::int64_t> builds{0};
  const std::int64_t build = builds.fetch_add(1);
  const std::vector<remote_module::RemoteModule> first = job.replicas.front().split.modules();
  std::int64_t layers = 0;
  for (std::size_t k = 0; k < first.size(); ++k) {
    std::vector<remote_module::RemoteModule> copies;
    for (const Replica& replica : job.replicas) copies.push_back(replica.split.modules()[k]);
    layers += remote_module::RemoteModule::take_step_statistics(
        copies, fmt::format("ferry/batchnorm/{}/{}/{}/", rpc::self().rank, build, k));
  }
  if (layers == 0) fail_setting("--sync-batchnorm: no stage of the model has a batch norm");
  log::info("batch norms: statistics of the whole step ({} layers{})", layers,
            job.replicas.size() > 1 ? fmt::format(", summed over {} replicas", job.replicas.size())
                                    : std::string());
}

// `workers` holds every replica's places, replica by replica (place_stages).
std::unique_ptr<StagesOnWorkers> build_stages(const TrainSettings& s, const StagePlan& plan,
                                              const std::vector<std::string>& workers) {
  auto job = std::make_unique<StagesOnWorkers>();
  const std::size_t stages = plan.stages.size();
  const remote_module::Precision precision = precision_of(s);
  std::vector<std::vector<rpc::RRefPtr>> parameters;
  for (int r = 0; r < s.replicas; ++r) {
    std::vector<std::string> places(workers.begin() + r * stages,
                                    workers.begin() + (r + 1) * stages);
    // One seed for all: every replica starts from the same weights.
    job->replicas.push_back(
        Replica{RemoteUnet::create(plan.depth, s.classes, plan.on(places),
                                   static_cast<int64_t>(s.seed), s.freeze_batchnorm),
                nullptr});
    Replica& replica = job->replicas.back();
    if (precision != remote_module::Precision::Float32) {
      for (const remote_module::RemoteModule& stage : replica.split.modules())
        stage.set_precision(precision);
    }
    replica.pipe = pipeline_of(s, replica.split);
    parameters.push_back(replica.split.parameters());
  }
  if (s.sync_batchnorm) take_step_statistics(*job);
  // The file is read once; the other replicas get replica 0's tensors.
  if (!s.weights.empty()) {
    load_weights(job->split(), s);
    align_replicas(*job);
  }
  job->optimizer = std::make_unique<dist_autograd::DistributedOptimizer>(optimizer_spec(s),
                                                                         std::move(parameters));
  return job;
}

// Where a run stands between epochs: what a checkpoint saves beside the weights and the
// optimizer's state, so that --resume goes on along the same learning-rate curve and keeps its
// best epoch.
struct Progress {
  int epoch = 0;          // epochs done
  std::int64_t step = 0;  // optimizer steps done
  std::optional<EpochMonitor> monitor;
};

remote_module::NamedValues progress_values(const Progress& p, const StagesOnWorkers& job) {
  remote_module::NamedValues values{
      {"optimizer", job.optimizer->state_dict()}, {"epoch", int64_t{p.epoch}}, {"step", p.step}};
  if (p.monitor) {
    values["monitor"] = p.monitor->metric();
    values["best_epoch"] = int64_t{p.monitor->best_epoch()};
    values["best_value"] = p.monitor->best_value();
    values["stale_epochs"] = int64_t{p.monitor->stale_epochs()};
  }
  return values;
}

// Loads the latest checkpoint in `dir` into replica 0 (read once; the other replicas get its
// tensors) and the optimizer, and `progress` with where it was saved. Tensors are found by name,
// so the checkpoint may come from another cut; the optimizer's state is per parameter in the
// whole model's order, which no cut changes.
void restore(StagesOnWorkers& job, const std::string& dir, std::size_t epoch_steps,
             Progress& progress) {
  remote_module::NamedValues extra =
      remote_module::load_checkpoint_by_tensor_name(dir, job.split().named());
  align_replicas(job);
  job.optimizer->load_state_dict(extra.at("optimizer"));
  progress.epoch = static_cast<int>(extra.at("epoch").toInt());
  // Checkpoints written before schedules counted no steps: a step per batch then.
  progress.step = extra.count("step") ? extra.at("step").toInt()
                                      : progress.epoch * static_cast<int64_t>(epoch_steps);
  if (!progress.monitor) return;
  EpochMonitor& monitor = *progress.monitor;
  monitor.restore(0, 0, 0);
  if (!extra.count("monitor")) return;
  if (extra.at("monitor").toStringRef() != monitor.metric()) {
    log::warn("the checkpoint in {} watched {}; --monitor {} starts afresh", dir,
              extra.at("monitor").toStringRef(), monitor.metric());
    return;
  }
  monitor.restore(static_cast<int>(extra.at("best_epoch").toInt()),
                  extra.at("best_value").toDouble(),
                  static_cast<int>(extra.at("stale_epochs").toInt()));
}

// Optimizer steps in an epoch of `batches`: the last may sum fewer than --accumulate batches.
std::size_t steps_per_epoch(std::size_t batches, int accumulate) {
  return (batches + accumulate - 1) / accumulate;
}

// Where an epoch's time went, as the master saw it.
struct EpochTimes {
  double train_s = 0;      // in steps: forward, backward and the optimizer
  double optimizer_s = 0;  // in the optimizer's calls (with replicas, their all-reduce too)
  std::size_t batches = 0;
  int64_t images = 0;
  std::uint64_t bytes_sent = 0;  // by every process of the job
};

// Bytes every process of the job has sent so far: this one and each worker holding a stage.
std::uint64_t bytes_sent_by_job(const StagesOnWorkers& job) {
  std::uint64_t total = rpc::agent().bytes_sent();
  std::set<std::string> counted{rpc::self().name};
  for (const Replica& replica : job.replicas) {
    for (const RemoteUnet::Stage& stage : replica.split.stages()) {
      if (!counted.insert(stage.module.worker()).second) continue;
      total += static_cast<std::uint64_t>(stage.module.stats().worker_bytes_sent);
    }
  }
  return total;
}

// One pass over the training set. Each batch's gradients are kept on the owners until
// --accumulate of them are summed into one optimizer step, its learning rate the schedule's at
// `step`.
EpochTimes train_epoch(StagesOnWorkers& job, data::BatchLoader& loader, int epoch,
                       const TrainSettings& s, const dist_autograd::LrSchedule& schedule,
                       std::int64_t& step) {
  // Each batch's loss is a mean over its images; 1/K of it, summed over K batches, is the mean
  // over the K batches, as one step on a K times larger batch.
  const double scale = 1.0 / s.accumulate;
  auto micro_loss = [&s, scale](const at::Tensor& out, const at::Tensor& target) {
    return loss_of(s.loss, out, target) * scale;
  };
  loader.start_epoch(epoch);
  ProgressBar bar(fmt::format("epoch {}/{}", epoch, s.epochs), loader.batches());
  double loss_sum = 0, rate = 0;
  EpochTimes times;
  const std::uint64_t bytes_before = bytes_sent_by_job(job);
  std::size_t index = 0;
  const std::size_t count = job.replicas.size();
  while (auto batch = loader.next()) {
    auto start = Clock::now();
    ++index;
    const bool steps = index % s.accumulate == 0 || index == loader.batches();
    // Each replica's share of the batch in an autograd context of its own (released once the
    // optimizer has stepped with them all).
    std::vector<std::unique_ptr<dist_autograd::Context>> contexts(count);
    std::vector<std::int64_t> ids(count);
    std::vector<double> losses(count);
    for_each_replica(count, [&](std::size_t r) {
      contexts[r] = std::make_unique<dist_autograd::Context>();
      ids[r] = contexts[r]->id();
      Replica& replica = job.replicas[r];
      at::Tensor images = share_of(batch->images, r, count);
      at::Tensor masks = share_of(batch->masks, r, count);
      if (replica.pipe) {
        losses[r] = replica.pipe->step(images, masks, micro_loss).loss / scale;
        return;
      }
      at::Tensor loss = loss_of(s.loss, replica.split.forward(images, !s.via_master), masks);
      dist_autograd::backward(ids[r], {loss * scale});
      losses[r] = loss.item<double>();
    });
    auto optimizer_start = Clock::now();
    if (steps) {
      const double lr = schedule.lr_at(step);
      if (lr != job.optimizer->spec().options.at("lr")) job.optimizer->set_lr(lr);
      job.optimizer->step(ids);
      ++step;
    } else {
      job.optimizer->accumulate(ids);
    }
    times.optimizer_s += std::chrono::duration<double>(Clock::now() - optimizer_start).count();
    contexts.clear();
    double loss_value = 0;
    for (double l : losses) loss_value += l / count;
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    times.train_s += seconds;
    times.images += batch->images.size(0);
    double images_per_s = batch->images.size(0) / seconds;
    rate = index == 1 ? images_per_s : 0.9 * rate + 0.1 * images_per_s;
    loss_sum += loss_value;
    bar.update(index, fmt::format("loss {:.4f} {:.1f} img/s", loss_sum / index, rate));
  }
  job.last_train_loss = loss_sum / std::max<std::size_t>(index, 1);
  times.batches = index;
  times.bytes_sent = bytes_sent_by_job(job) - bytes_before;
  return times;
}

// --log-dir's file: the figures of each epoch and each stage's busy share.
std::optional<MetricsLog> metrics_log_of(const TrainSettings& s, const StagePlan& plan) {
  if (s.log_dir.empty()) return std::nullopt;
  std::vector<std::string> columns = {"train_loss", "val_loss", "val_iou",     "val_dice",
                                      "lr",         "train_s",  "images_per_s"};
  for (const auto& stage : plan.stages) columns.push_back("busy_" + stage.name);
  return MetricsLog(s.log_dir, columns);
}

std::string best_dir(const TrainSettings& s) {
  return (std::filesystem::path(s.checkpoint_dir) / "best").string();
}

int train_as_master(const TrainSettings& s) {
  depth_of(s.model);  // an unknown model fails before the data is read
  if (s.loss != "bce" && s.loss != "dice" && s.loss != "bce+dice") {
    fail_setting(fmt::format("--loss must be bce, dice or bce+dice, not \"{}\"", s.loss));
  }
  if (s.accumulate < 1)
    fail_setting(fmt::format("--accumulate must be 1 or more, not {}", s.accumulate));
  if (s.replicas < 1) fail_setting(fmt::format("--replicas must be 1 or more, not {}", s.replicas));
  precision_of(s);
  check_sync_batchnorm(s);
  // The data first: a wrong folder is found before any worker builds a stage.
  auto [train_set, validation_set] = datasets_of(s);
  auto [train_indices, validation_indices] =
      data::split_indices(train_set->size(), s.validation_share);
  // --batch-size is per replica, as a distributed sampler's: a step takes that many images for
  // each, all different, shuffled anew each epoch.
  const int64_t global_batch = s.batch_size * s.replicas;
  data::BatchLoader train_loader(train_set, train_indices, global_batch, s.seed,
                                 /*drop_last=*/true);
  if (train_loader.batches() == 0) {
    fail_setting(fmt::format(
        "{} training images do not make one batch of {}{}", train_indices.size(), global_batch,
        s.replicas > 1 ? fmt::format(" ({} replicas of {})", s.replicas, s.batch_size) : ""));
  }
  data::BatchLoader validation_loader(validation_set, validation_indices, global_batch,
                                      std::nullopt);
  const std::size_t epoch_steps = steps_per_epoch(train_loader.batches(), s.accumulate);
  const dist_autograd::LrSchedule schedule =
      schedule_of(s, static_cast<std::int64_t>(epoch_steps) * s.epochs);
  Progress progress;
  progress.monitor = monitor_of(s);

  const StagePlan plan = plan_of(s);
  std::vector<std::string> workers = place_stages(plan, s.placement, s.spares, s.replicas);
  const std::vector<std::string> stage_names = replica_stage_names(plan, s.replicas);
  const std::size_t stage_count = plan.stages.size();
  std::cerr << plan_table(plan, {workers.begin(), workers.begin() + stage_count}) << std::flush;
  for (int r = 1; r < s.replicas; ++r) {
    std::vector<std::string> places;
    for (std::size_t k = 0; k < stage_count; ++k) {
      places.push_back(
          fmt::format("{} {}", stage_names[r * stage_count + k], workers[r * stage_count + k]));
    }
    log::info("replica {}: {}", r, fmt::join(places, ", "));
  }
  std::vector<std::string> spares;
  for (size_t r = rpc::workers().size() - s.spares; r < rpc::workers().size(); ++r) {
    spares.push_back(rpc::workers()[r].name);
  }
  if (!spares.empty()) {
    log::info("spare workers: {}", fmt::join(spares, ", "));
    if (s.checkpoint_dir.empty()) {
      log::warn(
          "--spares without --checkpoint-dir: a lost worker's stages start again from "
          "the first epoch");
    }
  }
  std::unique_ptr<StagesOnWorkers> job = build_stages(s, plan, workers);

  if (s.resume) {
    if (s.checkpoint_dir.empty()) fail_setting("--resume needs --checkpoint-dir");
    restore(*job, s.checkpoint_dir, epoch_steps, progress);
    log::info("resumed from {} after epoch {} (optimizer step {})", s.checkpoint_dir,
              progress.epoch, progress.step);
  }
  std::optional<MetricsLog> metrics_log = metrics_log_of(s, plan);
  if (metrics_log && s.resume) {
    const std::string why = metrics_log->resume_after(progress.epoch);
    if (!why.empty()) log::warn("--log-dir: {}", why);
  }
  const std::string plot_title = fmt::format("{}, {} stages, {} x {}: loss and IoU by epoch",
                                             s.model, stage_count, s.image_size, s.image_size);
  if (schedule.kind != dist_autograd::LrSchedule::Kind::Constant || schedule.warmup_steps > 0) {
    log::info("learning rate: {}", schedule.describe());
  }

  nlohmann::ordered_json metrics;
  metrics["epochs"] = nlohmann::ordered_json::array();
  double train_s = 0;
  int takeovers = 0;
  int stopped_after = 0;  // the epoch early stopping ended the run after, if it did
  for (;;) {
    try {
      for (int epoch = progress.epoch + 1; epoch <= s.epochs; ++epoch) {
        const std::vector<double> busy_before = busy_seconds(job->replicas.front());
        const EpochTimes times = train_epoch(*job, train_loader, epoch, s, schedule, progress.step);
        const std::vector<double> busy_after = busy_seconds(job->replicas.front());
        train_s += times.train_s;
        align_replicas(*job);
        Validation v = validate(job->replicas, validation_loader, s.loss, !s.via_master);
        const double lr = job->optimizer->spec().options.at("lr");
        if (metrics_log) {
          EpochFigures row{epoch,
                           {job->last_train_loss, v.loss, v.iou, v.dice, lr, times.train_s,
                            times.images / times.train_s}};
          for (size_t k = 0; k < busy_after.size(); ++k) {
            row.values.push_back((busy_after[k] - busy_before[k]) / times.train_s);
          }
          metrics_log->add(row);
          metrics_log->write_plot(plot_title);
        }
        metrics["epochs"].push_back({{"epoch", epoch},
                                     {"train_loss", job->last_train_loss},
                                     {"val_loss", v.loss},
                                     {"val_iou", v.iou},
                                     {"val_dice", v.dice},
                                     {"lr", lr},
                                     {"train_s", times.train_s},
                                     {"optimizer_s", times.optimizer_s},
                                     {"batches", times.batches},
                                     {"images_per_s", times.images / times.train_s},
                                     {"bytes_per_step", times.bytes_sent / times.batches}});
        std::cerr << fmt::format(
            "epoch {}/{}: train loss {:.4f}, validation loss {:.4f}, IoU "
            "{:.3f}, Dice {:.3f}, learning rate {:.3g}\n",
            epoch, s.epochs, job->last_train_loss, v.loss, v.iou, v.dice, lr);
        progress.epoch = epoch;
        EpochMonitor::Verdict verdict;
        if (progress.monitor)
          verdict = progress.monitor->observe(epoch, v.of(progress.monitor->metric()));
        if (!s.checkpoint_dir.empty()) {
          remote_module::NamedValues values = progress_values(progress, *job);
          remote_module::save_checkpoint(s.checkpoint_dir, job->split().named(), 2, values);
          if (s.save_best && verdict.improved) {
            remote_module::save_checkpoint(best_dir(s), job->split().named(), 1, values);
          }
        }
        if (verdict.stop) {
          stopped_after = epoch;
          break;
        }
      }
      break;
    } catch (const rpc::Error& e) {
      std::vector<std::string> taken;
      if (!spares.empty() &&
          (e.kind() == rpc::ErrorKind::PeerDied || e.kind() == rpc::ErrorKind::Timeout)) {
        // The error may come from a worker that saw the loss before this process's own
        // connection to the lost worker closed: give that a moment.
        auto until = Clock::now() + std::chrono::seconds(3);
        while ((taken = take_over_lost_workers(stage_names, workers, spares)).empty() &&
               Clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
      if (taken.empty()) {
        throw rpc::Error(
            e.kind(),
            fmt::format("{}{}", e.what(), stages_concerned(e, job->splits(), s.checkpoint_dir)));
      }
      log::warn("{}; {}", e.what(), fmt::join(taken, "; "));
      // The stages that survived are rebuilt too: all of them go back to the same checkpoint.
      job.reset();
      job = build_stages(s, plan, workers);
      bool saved = !s.checkpoint_dir.empty() &&
                   std::filesystem::exists(std::filesystem::path(s.checkpoint_dir) / "LATEST");
      progress = Progress{0, 0, monitor_of(s)};
      if (saved) restore(*job, s.checkpoint_dir, epoch_steps, progress);
      log::warn("training goes on from epoch {}{}", progress.epoch + 1,
                saved ? fmt::format(" (the checkpoint in {})", s.checkpoint_dir) : "");
      if (metrics_log) metrics_log->truncate_after(progress.epoch);
      auto& done = metrics["epochs"];
      while (!done.empty() && done.back()["epoch"].get<int>() > progress.epoch) {
        done.erase(done.size() - 1);
      }
      ++takeovers;
    }
  }
  metrics["takeovers"] = takeovers;
  metrics["replicas"] = s.replicas;
  if (progress.monitor) {
    report_best(*progress.monitor, s.save_best ? best_dir(s) : "", stopped_after, metrics);
  }
  metrics["stages"] = nlohmann::ordered_json::array();
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    remote_module::StageStats stats = job->split().stages()[k].module.stats();
    metrics["stages"].push_back({{"name", plan.stages[k].name},
                                 {"worker", workers[k]},
                                 {"blocks", plan.stages[k].blocks},
                                 {"parameters", plan.stages[k].parameters},
                                 {"estimated_peak_mib", plan.stages[k].peak_mib},
                                 {"worker_peak_tensor_mib", stats.worker_peak_tensor_mib},
                                 {"worker_peak_rss_mib", stats.worker_peak_rss_mib}});
  }
  RemoteUnet& split = job->split();
  std::unique_ptr<pipeline::Pipeline>& pipe = job->replicas.front().pipe;
  if (!pipe) {
    print_stage_table(split, train_s, !s.via_master);
  } else {
    std::cerr << "\n" << pipe->timeline().table();
    std::vector<pipeline::Pipeline::StageMemory> memory = pipe->memory_peaks();
    std::string peaks;
    for (size_t k = 0; k < memory.size(); ++k) {
      peaks += fmt::format("{}{} {:.0f} MiB", k ? ", " : "", plan.stages[k].name,
                           memory[k].activation_mib);
    }
    std::cerr << "most activations held at once: " << peaks << "\n";
    pipeline::TimelineReport report = pipe->timeline().report();
    metrics["pipeline"] = {{"schedule", pipeline::schedule_name(pipe->options().schedule)},
                           {"microbatches", pipe->options().microbatches},
                           {"bubble", report.bubble},
                           {"ideal_bubble", report.ideal_bubble}};
    if (!s.trace_file.empty()) {
      pipe->timeline().write_chrome_trace(s.trace_file);
      std::cerr << fmt::format(
          "trace of {} steps written to {} (open it in Perfetto or "
          "chrome://tracing)\n",
          report.steps, s.trace_file);
    }
  }
  if (s.compare_single_process) {
    double whole =
        single_process_peak_mib(s.model, s.classes, s.image_size, s.batch_size, s.optimizer);
    std::cerr << fmt::format(
        "the whole model trained in one process (same batch) peaks at {:.0f} "
        "MiB\n",
        whole);
    metrics["single_process_peak_mib"] = whole;
  }
  metrics["train_s"] = train_s;
  if (metrics_log) {
    std::cerr << fmt::format("per-epoch figures in {}, their curves in {}\n",
                             metrics_log->csv_path(), metrics_log->plot_path());
  }
  if (!s.metrics_file.empty()) {
    std::ofstream(s.metrics_file) << metrics.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int run_training(const TrainSettings& settings) {
  rpc::Options options;
  options.secret_file = settings.secret_file;
  try {
    options = rpc::resolve_options(options);
  } catch (const rpc::Error& e) {
    log::error("{}", e.what());
    return 2;
  }
  if (settings.memory_budget_mib > 0) {
    core::set_tensor_memory_budget(settings.memory_budget_mib << 20);
  }
  if (!load_plugins(settings.plugins)) return 2;
  if (options.rank != 0) return serve_as_worker(options);
  return run_as_master(
      options, "training", [&] { return train_as_master(settings); },
      [](std::string what) {
        if (what.find(core::kOverBudget) != std::string::npos) {
          what +=
              "; to fit, cut the model into more stages (--stages), use more micro-batches "
              "(--pipeline 1f1b --microbatches M) or recompute activations "
              "(--checkpoint-activations)";
        }
        return what;
      });
}

}  // namespace ferry::examples
