// Saving a run's state and bringing it back: checkpoints at steps and epochs through the
// background writer, and spares taking over a lost worker's stages from the surviving replicas
// or from the last checkpoint.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <filesystem>

#include "ferry/core/backoff.h"
#include "ferry/core/log.h"
#include "ferry/rpc/rpc.h"
#include "trainer/placement.h"
#include "trainer/train_run.h"

namespace ferry::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Waits for the checkpoint writer after a lost worker: a checkpoint whose copies were on that
// worker cannot be brought here (nor one the disk refused), and the one before it is used.
void settle(Run& run, const std::function<void()>& wait) {
  try {
    wait();
  } catch (const rpc::Error& e) {
    log::warn("a checkpoint could not be kept ({}); the one before it is used", e.what());
    run.events->add("checkpoint_lost", {{"error", e.what()}});
  }
}

// Every stage rebuilt with the spares from the copies that survived in the other replicas, at the
// step the run had reached: what the log says it went on from, or nullopt where it cannot (no
// replicas, or a stage with no copy left as it was after the step), with `why_not` said where
// there were replicas.
std::optional<std::string> from_surviving_replicas(Run& run, std::string& why_not) {
  if (!run.job || run.job->replicas.size() < 2) return std::nullopt;
  const bool steps_done = run.progress.batch >= run.train_loader->batches();
  if (steps_done && !(run.trained && run.trained->epoch == run.progress.epoch + 1)) {
    why_not = "the epoch's figures were lost with its last step";
    log::info("{}; training goes back to the last checkpoint", why_not);
    return std::nullopt;
  }
  try {
    const std::vector<PeerSource> sources =
        rebuild_from_peers(run.job, run.s, run.plan, run.workers, why_not);
    if (!why_not.empty()) {
      log::info("{}; training goes back to the last checkpoint", why_not);
      return std::nullopt;
    }
    std::vector<std::string> said;
    for (const PeerSource& p : sources) {
      said.push_back(fmt::format("stage {} of replica {} from replica {}'s, on worker \"{}\"",
                                 p.stage, p.replica, p.from_replica, p.from_worker));
    }
    return fmt::format("the surviving replicas: {}", fmt::join(said, ", "));
  } catch (const rpc::Error& failed) {
    why_not = fmt::format("the stages could not be rebuilt from the surviving replicas ({})",
                          failed.what());
    log::warn("{}; training goes back to the last checkpoint", why_not);
    return std::nullopt;
  }
}

// Every stage rebuilt with the spares, all going back to the newest checkpoint the writer has
// brought here, whether or not it is on disk yet; a run resumed from disk that has saved nothing
// since reads it back. What the log says it went on from.
std::string from_last_checkpoint(Run& run) {
  const TrainSettings& s = run.s;
  run.job.reset();
  run.job = build_stages(s, run.plan, run.workers);
  run.progress = Progress{0, 0, 0, 0, monitor_of(s)};
  run.trained.reset();
  const std::optional<remote_module::CheckpointContent> last =
      run.writer ? run.writer->last_taken() : std::nullopt;
  if (last) {
    restore(*run.job, *last, run.epoch_steps, run.progress);
    return "the last checkpoint, kept in memory";
  }
  if (!s.checkpoint_dir.empty() && remote_module::has_checkpoint(s.checkpoint_dir)) {
    return "the checkpoint " + restore(*run.job, s.checkpoint_dir, run.epoch_steps, run.progress);
  }
  return "the first step";
}

}  // namespace

std::string best_dir(const TrainSettings& s) {
  return (std::filesystem::path(s.checkpoint_dir) / "best").string();
}

std::string where_in_training(const Run& run) {
  const Progress& p = run.progress;
  if (p.batch == 0) return fmt::format("after epoch {}", p.epoch);
  return fmt::format("after batch {} of {} of epoch {}", p.batch, run.train_loader->batches(),
                     p.epoch + 1);
}

void save_checkpoints(Run& run, bool improved) {
  const TrainSettings& s = run.s;
  if (!run.writer) return;
  const auto start = Clock::now();
  remote_module::NamedValues values = progress_values(run.progress);
  // What predict and export need to feed the model as it was trained.
  values["normalize"] = normalization_of(s).to_string();
  values["image_size"] = s.plan.image_size.text();
  values["resize"] = data::resize_name(s.resize);
  // Each worker copies its state; the writer's threads bring the copies here and write them.
  const dist_autograd::DistributedOptimizer::TakenState optimizer =
      run.job->optimizer->take_state();
  const double optimizer_copy_s = std::chrono::duration<double>(Clock::now() - start).count();
  const remote_module::CheckpointWriter::Take take =
      remote_module::take_checkpoint(run.job->split().named(), std::move(values),
                                     {{"optimizer", [optimizer] { return optimizer.fetch(); }}});
  const double copy_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (s.save_best && improved) run.writer->save(best_dir(s), take, 1);
  EventLog& events = *run.events;
  const nlohmann::ordered_json at = {{"epoch", run.progress.epoch},
                                     {"batch", run.progress.batch},
                                     {"step", run.progress.step},
                                     {"copy_s", copy_s},
                                     {"optimizer_copy_s", optimizer_copy_s}};
  run.writer->save(
      s.checkpoint_dir, take, s.keep_checkpoints,
      [&events, at](const std::string& folder, double take_s, double write_s) {
        nlohmann::ordered_json fields = at;
        fields["folder"] = folder;
        fields["fetch_s"] = take_s;
        fields["write_s"] = write_s;
        events.add("checkpoint", fields);
      },
      /*replaceable=*/run.progress.batch > 0);
}

void step_done(Run& run, int epoch, const EpochPass::StepEnd& end) {
  // Where a rebuild from the surviving replicas goes on from, and what a checkpoint saves.
  run.progress.epoch = epoch - 1;
  run.progress.batch = end.batch;
  run.progress.loss_sum = end.epoch_loss_sum;
  run.events->add("step",
                  {{"step", end.step}, {"epoch", epoch}, {"batch", end.batch}, {"loss", end.loss}});
  const int every = run.s.checkpoint_every_steps;
  if (every == 0 || end.step % every != 0 || end.batch >= run.train_loader->batches()) return;
  save_checkpoints(run);
}

void take_over(Run& run, const rpc::Error& e) {
  const TrainSettings& s = run.s;
  const auto start = Clock::now();
  const std::vector<std::string> lost = rpc::agent().lost_workers();
  run.events->add("worker_lost", {{"workers", lost}, {"error", e.what()}});
  std::vector<TakenOver> taken;
  if (!run.spares.empty() && rpc::is_lost(e)) {
    // The error may come from a worker that saw the loss before this process's own connection
    // to the lost worker closed: give that a moment.
    core::poll_with_backoff(
        [&] {
          taken = take_over_lost_workers(run.stage_names, run.workers, run.spares,
                                         rpc::agent().lost_workers());
          return !taken.empty();
        },
        Clock::now() + std::chrono::seconds(3), std::chrono::milliseconds(50));
  }
  const auto spare_found = Clock::now();
  if (taken.empty()) {
    // What the writer was given is on disk before the user is told to resume from it.
    if (run.writer) settle(run, [&run] { run.writer->wait(); });
    throw rpc::Error(e.kind(),
                     fmt::format("{}{}", e.what(),
                                 run.job ? stages_concerned(e, run.job->splits(), s.checkpoint_dir)
                                         : std::string()));
  }
  std::vector<std::string> said;
  nlohmann::ordered_json spares_in = nlohmann::ordered_json::array();
  for (const TakenOver& t : taken) {
    said.push_back(t.describe());
    spares_in.push_back({{"lost", t.lost}, {"spare", t.spare}, {"stages", t.stages}});
  }
  log::warn("{}; {}", e.what(), fmt::join(said, "; "));
  // A checkpoint whose copies were on the lost worker is said to be lost before going on.
  if (run.writer) settle(run, [&run] { run.writer->wait_taken(); });
  const std::int64_t reached = run.progress.step;
  std::string not_from_replicas;
  std::optional<std::string> from = from_surviving_replicas(run, not_from_replicas);
  if (!from) from = from_last_checkpoint(run);
  const auto restored = Clock::now();
  const std::int64_t lost_steps = reached - run.progress.step;
  const std::size_t batches = run.train_loader->batches();
  std::string at;
  if (run.progress.batch >= batches) {
    at = ", its steps all done, at its validation";
  } else if (run.progress.batch > 0) {
    at = fmt::format(", batch {} of {}", run.progress.batch + 1, batches);
  }
  log::warn("training goes on from epoch {}{} ({}; {} optimizer step{} to train again)",
            run.progress.epoch + 1, at, *from, lost_steps, lost_steps == 1 ? "" : "s");
  if (run.metrics_log) run.metrics_log->truncate_after(run.progress.epoch);
  std::vector<EpochRecord>& done = run.report.epochs;
  while (!done.empty() && done.back().epoch > run.progress.epoch) done.pop_back();
  ++run.takeovers;
  nlohmann::ordered_json fields = {{"taken", spares_in},
                                   {"from", *from},
                                   {"epoch", run.progress.epoch},
                                   {"batch", run.progress.batch},
                                   {"step", run.progress.step},
                                   {"steps_lost", lost_steps},
                                   {"spare_s", seconds(start, spare_found)},
                                   {"restore_s", seconds(spare_found, restored)}};
  if (!not_from_replicas.empty()) fields["not_from_replicas"] = not_from_replicas;
  run.events->add("takeover", fields);
}

}  // namespace ferry::trainer
