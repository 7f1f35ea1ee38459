// The training job on the master, in the pieces a run goes through: its settings checked, its
// data, cut and stages set up, one epoch after another (train, validate, record, checkpoint,
// re-balance), and the end-of-run report; saving and going on after a lost worker are in
// train_recovery.cc. Times are taken on both sides so that the report can say where each
// stage's time went.
#include "ferry/trainer/train.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "ferry/core/files.h"
#include "ferry/core/log.h"
#include "ferry/core/process_memory.h"
#include "ferry/data/dataset.h"
#include "ferry/dist_autograd/lr_schedule.h"
#include "ferry/pipeline/pipeline.h"
#include "ferry/remote_module/checkpoint.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "ferry/trainer/model_tools.h"
#include "ferry/trainer/plan_command.h"
#include "ferry/trainer/worker_loop.h"
#include "trainer/epoch_monitor.h"
#include "trainer/epoch_rebalance.h"
#include "trainer/metrics_log.h"
#include "trainer/placement.h"
#include "trainer/replicas.h"
#include "trainer/stage_compute.h"
#include "trainer/stage_plan.h"
#include "trainer/stages_on_workers.h"
#include "trainer/train_epoch.h"
#include "trainer/train_report.h"
#include "trainer/train_run.h"
#include "trainer/train_setup.h"

namespace ferry::trainer {
namespace {

using Clock = std::chrono::steady_clock;

// The data first: a wrong folder is found before any worker builds a stage. --batch-size is per
// replica, as a distributed sampler's: a step takes that many images for each, all different,
// shuffled anew each epoch.
void load_data(Run& run) {
  const TrainSettings& s = run.s;
  auto [train_set, validation_set, train_indices, validation_indices] = datasets_of(s);
  run.class_names = class_names_of(s);
  const int64_t global_batch = s.plan.batch_size * s.replicas;
  run.train_loader = std::make_unique<data::BatchLoader>(
      train_set, train_indices, global_batch, s.seed, /*drop_last=*/true, s.loader_threads);
  if (run.train_loader->batches() == 0) {
    rpc::refuse(fmt::format(
        "{} training images do not make one batch of {}{}", train_indices.size(), global_batch,
        s.replicas > 1 ? fmt::format(" ({} replicas of {})", s.replicas, s.plan.batch_size) : ""));
  }
  run.validation_loader =
      std::make_unique<data::BatchLoader>(validation_set, validation_indices, global_batch,
                                          std::nullopt, /*drop_last=*/false, s.loader_threads);
  run.epoch_steps = steps_per_epoch(run.train_loader->batches(), s.accumulate);
  run.schedule = schedule_of(s, static_cast<std::int64_t>(run.epoch_steps) * s.epochs);
  run.progress.monitor = monitor_of(s);
}

// The places of replica 0's stages: what the tables show and the budget is checked on.
std::vector<std::string> first_places(const Run& run) {
  return {run.workers.begin(), run.workers.begin() + run.plan.stages.size()};
}

// The cut, its places and the spares, shown before the stages are built.
void place(Run& run) {
  const TrainSettings& s = run.s;
  run.plan = plan_of(s);
  run.rebalance.emplace(s, plan_settings_of(s), run.plan);  // a bad --rebalance-to fails here
  const std::vector<std::string> world = world_names();
  run.workers = place_stages(run.plan, s.placement, s.spares, s.replicas, world);
  run.stage_names = replica_stage_names(run.plan, s.replicas);
  const std::size_t stage_count = run.plan.stages.size();
  std::cerr << plan_table(run.plan, first_places(run)) << std::flush;
  for (int r = 1; r < s.replicas; ++r) {
    std::vector<std::string> places;
    for (std::size_t k = 0; k < stage_count; ++k) {
      places.push_back(fmt::format("{} {}", run.stage_names[r * stage_count + k],
                                   run.workers[r * stage_count + k]));
    }
    log::info("replica {}: {}", r, fmt::join(places, ", "));
  }
  run.spares.assign(world.end() - s.spares, world.end());
  if (run.spares.empty()) return;
  log::info("spare workers: {}", fmt::join(run.spares, ", "));
  if (s.checkpoint_dir.empty()) {
    log::warn(
        "--spares without --checkpoint-dir: a lost worker's stages start again from the "
        "first epoch");
  }
}

// --log-dir's file: the figures of each epoch and each stage's busy share; with classes, each
// one's IoU and Dice.
std::optional<MetricsLog> metrics_log_of(const TrainSettings& s, const StagePlan& plan,
                                         const std::vector<std::string>& class_names) {
  if (s.log_dir.empty()) return std::nullopt;
  std::vector<std::string> columns = {"train_loss", "val_loss",     "val_iou",
                                      "val_dice",   "val_miou",     "lr",
                                      "train_s",    "images_per_s", "data_wait_share"};
  for (const auto& stage : plan.stages) columns.push_back("busy_" + stage.name);
  if (s.plan.classes > 1) {
    for (const std::string& name : class_names) columns.push_back("val_iou_" + name);
    for (const std::string& name : class_names) columns.push_back("val_dice_" + name);
  }
  return MetricsLog(s.log_dir, columns);
}

// The stages built, the checkpoint resumed from (--resume) and the metrics log opened.
void start(Run& run) {
  const TrainSettings& s = run.s;
  run.events->add("start", {{"epochs", s.epochs},
                            {"batches_per_epoch", run.train_loader->batches()},
                            {"steps_per_epoch", run.epoch_steps},
                            {"stages", run.plan.stages.size()},
                            {"replicas", s.replicas},
                            {"spares", run.spares.size()}});
  run.job = build_stages(s, run.plan, run.workers);
  if (s.resume) {
    if (s.checkpoint_dir.empty()) rpc::refuse("--resume needs --checkpoint-dir");
    const std::string folder = restore(*run.job, s.checkpoint_dir, run.epoch_steps, run.progress);
    log::info("resumed from {} {} (optimizer step {})", s.checkpoint_dir, where_in_training(run),
              run.progress.step);
    run.events->add("resume", {{"folder", folder},
                               {"epoch", run.progress.epoch},
                               {"batch", run.progress.batch},
                               {"step", run.progress.step}});
  }
  if (!s.checkpoint_dir.empty()) run.writer = std::make_unique<remote_module::CheckpointWriter>();
  run.metrics_log = metrics_log_of(s, run.plan, run.class_names);
  if (run.metrics_log && s.resume) {
    const std::string why = run.metrics_log->resume_after(run.progress.epoch);
    if (!why.empty()) log::warn("--log-dir: {}", why);
  }
  const dist_autograd::LrSchedule& schedule = *run.schedule;
  if (schedule.kind != dist_autograd::LrSchedule::Kind::Constant || schedule.warmup_steps > 0) {
    log::info("learning rate: {}", schedule.describe());
  }
}

// An epoch's figures: into the metrics log (and its plot), the run's report and a line; its
// stages' compute per step over its last `batches` (those since `before`).
void record_epoch(Run& run, int epoch, const EpochTimes& times, const Validation& v,
                  const StageSeconds& before, const StageSeconds& after, std::size_t batches) {
  const TrainSettings& s = run.s;
  const double loss = times.train_loss;
  const double lr = run.job->optimizer->spec().options.at("lr");
  const bool classes = s.plan.classes > 1;
  if (run.metrics_log) {
    EpochFigures row{epoch,
                     {loss, v.loss, v.iou, v.dice, v.miou, lr, times.train_s,
                      times.images / times.train_s, times.data_wait_share()}};
    for (std::size_t k = 0; k < after.busy.size(); ++k) {
      row.values.push_back((after.busy[k] - before.busy[k]) / times.train_s);
    }
    if (classes) {
      row.values.insert(row.values.end(), v.class_iou.begin(), v.class_iou.end());
      row.values.insert(row.values.end(), v.class_dice.begin(), v.class_dice.end());
    }
    run.metrics_log->add(row);
    run.metrics_log->write_plot(fmt::format("{}, {} stages, {}: loss and IoU by epoch",
                                            s.plan.model, run.plan.stages.size(),
                                            s.plan.image_size.extent()));
  }
  const std::vector<double> compute =
      run.compute.add_epoch(epoch, batches, before, after, run.plan, first_places(run));
  EpochRecord record;
  record.epoch = epoch;
  record.train_loss = loss;
  record.val_loss = v.loss;
  record.val_iou = v.iou;
  record.val_dice = v.dice;
  record.val_miou = v.miou;
  record.lr = lr;
  record.train_s = times.train_s;
  record.optimizer_s = times.optimizer_s;
  record.data_wait_s = times.data_wait_s;
  record.data_wait_share = times.data_wait_share();
  record.batches = times.batches;
  record.images_per_s = times.images / times.train_s;
  record.bytes_per_step = static_cast<double>(times.bytes_sent) / times.batches;
  record.stage_compute_s = compute;
  if (classes) record.classes = class_figures(run.class_names, v);
  run.report.epochs.push_back(std::move(record));
  std::cerr << fmt::format(
      "epoch {}/{}: train loss {:.4f}, validation loss {:.4f}, IoU {:.3f}, Dice {:.3f}, mIoU "
      "{:.3f}, learning rate {:.3g}\n",
      epoch, s.epochs, loss, v.loss, v.iou, v.dice, v.miou, lr);
  if (classes) {
    std::cerr << fmt::format("  IoU by class: {}\n", per_class(run.class_names, v.class_iou));
  }
  run.events->add("epoch", {{"epoch", epoch},
                            {"step", run.progress.step},
                            {"train_loss", loss},
                            {"val_loss", v.loss},
                            {"val_iou", v.iou}});
}

// At `when`: the cut EpochRebalance calls for from what the stages and blocks `measured` per
// batch, moved to while the job runs. True if the stages moved.
bool rebalance(Run& run, const RebalanceMoment& when, const StageSeconds& measured) {
  std::vector<RebalanceRecord>& records = run.report.rebalances;
  std::optional<StageMove> move =
      run.rebalance->look(when, run.job->replicas.front().pipe != nullptr, run.plan,
                          first_places(run), measured.compute, measured.blocks, records);
  if (!move) return false;
  // A failure while moving goes back to a checkpoint with the new cut.
  run.plan = std::move(move->to);
  // The last checkpoint's copies reach the master before the move is measured.
  if (run.writer) run.writer->wait_taken();
  const std::uint64_t received = rpc::agent().bytes_received();
  const auto start = std::chrono::steady_clock::now();
  move_stages(run.job, run.s, run.plan, run.workers, move->handover);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double master_mib = (rpc::agent().bytes_received() - received) / double(1 << 20);
  log::info("moved in {:.2f} s; the master received {:.2f} MiB of it", seconds, master_mib);
  records.back().move_s = seconds;
  records.back().master_received_mib = master_mib;
  run.compute.restart_on_new_cut();
  return true;
}

// An epoch's steps trained (with the first re-balance within it, when it is long enough), and
// what they took into run.trained.
void train_epoch_steps(Run& run, int epoch) {
  const TrainSettings& s = run.s;
  auto first_replica = [&run] { return stage_seconds(run.job->replicas.front()); };
  auto train_until = [&run](EpochPass& pass, std::size_t batches) {
    return pass.train_until(batches, *run.job, *run.schedule, run.progress.step);
  };
  // The last epoch's checkpoint is brought here before this one's bytes are counted.
  if (run.writer) run.writer->wait_taken();
  // The epoch's stage figures count from its start (or the batch it resumed at), or from the
  // last move within it.
  StageSeconds before = first_replica();
  std::size_t before_batch = run.progress.batch;
  const std::size_t look_at = run.rebalance->first_look_within(
      run.job->replicas.front().pipe != nullptr, run.train_loader->batches());
  EpochPass pass(*run.train_loader, epoch, s, *run.job, run.progress.batch, run.progress.loss_sum,
                 [&run, epoch](const EpochPass::StepEnd& end) { step_done(run, epoch, end); });
  if (look_at > before_batch) {
    // The first step warms up: the look measures the steps after it.
    train_until(pass, 1);
    const StageSeconds warm = first_replica();
    const std::size_t warm_done = pass.done();
    train_until(pass, std::max(look_at, warm_done + 1));
    const std::size_t done = pass.done();
    if (done > warm_done && rebalance(run, RebalanceMoment{epoch, done},
                                      per_batch(warm, first_replica(), done - warm_done))) {
      before = first_replica();
      before_batch = done;
    }
  }
  train_until(pass, std::numeric_limits<std::size_t>::max());
  // Kept before the workers are asked for their figures: a worker lost while they are read
  // leaves the steps trained, and the epoch without figures of its stages (no batches measured).
  run.trained = EpochTrained{epoch, pass.times(), before, before, 0};
  run.train_s += run.trained->times.train_s;
  run.data_wait_s += run.trained->times.data_wait_s;
  run.trained->times.bytes_sent = pass.bytes_sent(*run.job);
  run.trained->after = first_replica();
  run.trained->batches = pass.done() - before_batch;
}

// One epoch: its steps (unless they were trained before a lost worker's stages were rebuilt
// from the surviving replicas), then the replicas brought together, validation, its record, its
// checkpoint and a re-balance. True if the monitor says the run should stop.
bool run_epoch(Run& run, int epoch) {
  const TrainSettings& s = run.s;
  if (!run.trained || run.trained->epoch != epoch) train_epoch_steps(run, epoch);
  const EpochTrained trained = *run.trained;
  StagesOnWorkers& job = *run.job;
  align_replicas(job);
  const Validation v =
      validate(job.replicas, *run.validation_loader, loss_spec(s), !s.via_master, labels_of(s),
               microbatch_samples(s.plan.batch_size, s.microbatches));
  run.last_validation = v;
  record_epoch(run, epoch, trained.times, v, trained.before, trained.after, trained.batches);
  run.progress.epoch = epoch;
  run.progress.batch = 0;
  run.progress.loss_sum = 0;
  const StageSeconds each = per_batch(trained.before, trained.after, trained.batches);
  run.trained.reset();
  EpochMonitor::Verdict verdict;
  if (run.progress.monitor) {
    verdict = run.progress.monitor->observe(epoch, v.of(run.progress.monitor->metric()));
  }
  save_checkpoints(run, verdict.improved);
  // Not from an epoch whose stages' figures were lost with a worker.
  if (!verdict.stop && epoch < s.epochs && trained.batches > 0) {
    rebalance(run, RebalanceMoment{epoch, 0}, each);
  }
  return verdict.stop;
}

// Epochs until the last, early stopping or a loss no spare can take over; then every checkpoint
// is on disk.
void run_epochs(Run& run) {
  for (;;) {
    try {
      for (int epoch = run.progress.epoch + 1; epoch <= run.s.epochs; ++epoch) {
        if (run_epoch(run, epoch)) {
          run.stopped_after = epoch;
          break;
        }
      }
      if (run.writer) run.writer->wait();
      run.events->add("end", {{"epoch", run.progress.epoch}, {"step", run.progress.step}});
      return;
    } catch (const rpc::Error& e) {
      take_over(run, e);
    }
  }
}

// What each stage's worker measured over the run. Read before the pipeline's report, which
// starts new peaks.
std::vector<remote_module::StageStats> stage_stats(Run& run) {
  std::vector<remote_module::StageStats> out;
  for (std::size_t k = 0; k < run.plan.stages.size(); ++k) {
    out.push_back(run.job->split().stages()[k].module.stats());
  }
  return out;
}

// Each stage's plan beside what its worker measured, into the run's report, and its compute per
// step as a table.
void report_stages(Run& run, const std::vector<remote_module::StageStats>& measured) {
  std::vector<StageRecord>& stages = run.report.stages;
  stages.clear();
  for (std::size_t k = 0; k < run.plan.stages.size(); ++k) {
    const PlannedStage& planned = run.plan.stages[k];
    const remote_module::StageStats& stats = measured[k];
    StageRecord stage;
    stage.name = planned.name;
    stage.worker = run.workers[k];
    stage.device = stats.device;
    stage.blocks = planned.blocks;
    stage.parameters = planned.parameters;
    stage.estimated_peak_mib = planned.peak_mib;
    stage.worker_peak_tensor_mib = stats.worker_peak_tensor_mib;
    stage.worker_peak_rss_mib = stats.worker_peak_rss_mib;
    stage.worker_device_copy_s = stats.worker_device_copy_s;
    stages.push_back(std::move(stage));
  }
  run.compute.report(run.plan, first_places(run),
                     block_compute_s(run.plan, run.s.plan.batch_size, run.s.microbatches,
                                     run.s.checkpoint_activations),
                     stages, run.report.blocks);
}

// The end of the run: the best epoch, each stage's figures, the comparison with one process, and
// the metrics file (--metrics-file).
void report(Run& run) {
  const TrainSettings& s = run.s;
  RunReport& out = run.report;
  out.takeovers = run.takeovers;
  out.replicas = s.replicas;
  if (run.progress.monitor) {
    out.best =
        report_best(*run.progress.monitor, s.save_best ? best_dir(s) : "", run.stopped_after);
  }
  if (s.plan.classes > 1 && run.last_validation) {
    std::cerr << "\nthe last validation by class:\n"
              << class_table(run.class_names, *run.last_validation);
  }
  const std::vector<remote_module::StageStats> measured = stage_stats(run);
  std::unique_ptr<pipeline::Pipeline>& pipe = run.job->replicas.front().pipe;
  if (pipe) {
    out.pipeline = report_pipeline(*pipe, run.plan, s.trace_file);
  } else {
    print_stage_table(run.job->split(), run.train_s, !s.via_master);
  }
  report_stages(run, measured);
  if (run.job->replicas.size() > 1) out.gradient_buckets = bucket_records(*run.job->optimizer);
  if (s.compare_single_process) {
    const double whole = single_process_peak_mib(s.master_program, s.plan);
    std::cerr << fmt::format(
        "the whole model trained in one process (same batch) peaks at {:.0f} MiB\n", whole);
    out.single_process_peak_mib = whole;
  }
  out.train_s = run.train_s;
  out.data_wait_s = run.data_wait_s;
  const double wait_share = run.data_wait_s / std::max(run.train_s + run.data_wait_s, 1e-9);
  out.data_wait_share = wait_share;
  std::cerr << fmt::format(
      "waiting for data: {:.1f}% of the training steps' time ({:.2f} s; --loader-threads {})\n",
      100 * wait_share, run.data_wait_s, s.loader_threads);
  if (run.metrics_log) {
    std::cerr << fmt::format("per-epoch figures in {}, their curves in {}\n",
                             run.metrics_log->csv_path(), run.metrics_log->plot_path());
  }
  if (!s.metrics_file.empty()) {
    core::write_file_atomically(s.metrics_file, nlohmann::ordered_json(out).dump(2) + "\n");
  }
}

// One run of the job as `s` says. With `first_step_checks`, a run that runs out of memory under
// the budget before its first optimizer step is done ends there, its stages gone, and returns
// the error; otherwise nothing.
std::optional<std::string> train_run(const TrainSettings& s, bool first_step_checks) {
  check_settings(s);
  Run run(s);
  run.events = std::make_unique<EventLog>(s.events_file);
  load_data(run);
  place(run);
  try {
    start(run);
    run_epochs(run);
  } catch (const rpc::Error& e) {
    if (!first_step_checks || e.kind() != rpc::ErrorKind::OutOfMemory || run.progress.step > 0) {
      throw;
    }
    log::warn("--plan auto: the first step ran out of memory under the budget: {}", e.what());
    return e.what();
  }
  report(run);
  return std::nullopt;
}

// --plan auto's estimates are checked by the job's first step. Where it runs out of memory, the
// job plans again with every stage's estimated peak below the failed winner's largest (by
// kReplanMargin each time; at a smaller batch where nothing else fits the estimates), up to
// kReplans times; the last plan's run fails as any other.
constexpr int kReplans = 3;
constexpr double kReplanMargin = 0.9;

void train_planned_automatically(const TrainSettings& settings) {
  const int workers = std::max(static_cast<int>(world_names().size()) - 1 - settings.spares, 1);
  double limit_mib = 0;
  std::string ran_out;
  for (int replans = 0;; ++replans) {
    nlohmann::ordered_json plan;
    try {
      plan = plan_for_training(settings, workers, limit_mib);
    } catch (const rpc::Error& e) {
      if (limit_mib <= 0) throw;
      throw rpc::Error(rpc::ErrorKind::OutOfMemory,
                       fmt::format("{}; planned again with every stage's estimated peak within "
                                   "{:.0f} MiB, and {}",
                                   ran_out, limit_mib, e.what()));
    }
    const std::optional<std::string> out_of_memory =
        train_run(with_plan(settings, plan, "auto"), replans < kReplans);
    if (!out_of_memory) return;
    ran_out = *out_of_memory;
    limit_mib = kReplanMargin * plan.at("winner").at("predicted_peak_mib").get<double>();
    log::warn("--plan auto: planning again with every stage's estimated peak within {:.0f} MiB",
              limit_mib);
    EventLog(settings.events_file).add("replan", {{"estimate_limit_mib", limit_mib}});
  }
}

int train_as_master(const TrainSettings& settings) {
  if (settings.plan_auto) {
    train_planned_automatically(settings);
  } else if (!settings.plan_file.empty()) {
    train_run(with_plan(settings, read_plan_file(settings.plan_file), settings.plan_file), false);
  } else {
    train_run(settings, false);
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
  const MemoryBudget& budget = settings.memory_budget;
  if (budget.per_worker() &&
      static_cast<std::size_t>(options.world_size) != budget.mib.size() + 1) {
    log::error(
        "--memory-budget-mib {}: {} budgets, one per worker, for a world of {} besides the master",
        budget.text(), budget.mib.size(), options.world_size - 1);
    return 2;
  }
  if (budget.of_rank(options.rank) > 0) {
    core::set_tensor_memory_budget(budget.of_rank(options.rank) << 20);
  }
  if (!load_plugins(settings.plugins)) return 2;
  if (options.rank != 0) return serve_as_worker(options, settings.device);
  return run_as_master(
      options, "training", [&] { return train_as_master(settings); },
      [](const rpc::Failure& failure) -> std::string {
        if (failure.kind != rpc::ErrorKind::OutOfMemory) return "";
        return "; to fit, cut the model into more stages (--stages), use more "
               "micro-batches (--pipeline 1f1b --microbatches M) or recompute "
               "activations (--checkpoint-activations)";
      });
}

}  // namespace ferry::trainer
