#include "trainer/stages_on_workers.h"

#include <fmt/format.h>

#include <atomic>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "ferry/core/log.h"
#include "ferry/remote_module/checkpoint.h"
#include "ferry/remote_module/remote_module.h"
#include "ferry/remote_module/state_handover.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "trainer/train_setup.h"

namespace ferry::trainer {
namespace {

using models::RemoteUnet;

// Loads --weights into a replica's stages, saying what did not fit.
void load_weights(RemoteUnet& split, const TrainSettings& s) {
  models::LoadReport report = split.load_weights(s.weights);
  if (report.loaded == 0) {
    rpc::refuse(fmt::format("--weights {}: no tensor in it fits the model ({})", s.weights,
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
  if (layers == 0) rpc::refuse("--sync-batchnorm: no stage of the model has a batch norm");
  log::info("batch norms: statistics of the whole step ({} layers{})", layers,
            job.replicas.size() > 1 ? fmt::format(", summed over {} replicas", job.replicas.size())
                                    : std::string());
}

}  // namespace

void align_replicas(StagesOnWorkers& job) {
  const std::vector<RemoteUnet::Stage>& first = job.replicas.front().split.stages();
  for (std::size_t k = 0; k < first.size(); ++k) {
    const c10::Dict<std::string, at::Tensor> state = first[k].module.state_dict();
    for (std::size_t r = 1; r < job.replicas.size(); ++r) {
      job.replicas[r].split.stages()[k].module.load_state_dict(state);
    }
  }
}

std::unique_ptr<StagesOnWorkers> build_stages(const TrainSettings& s, const StagePlan& plan,
                                              const std::vector<std::string>& workers) {
  auto job = std::make_unique<StagesOnWorkers>();
  const std::size_t stages = plan.stages.size();
  std::vector<std::vector<rpc::RRefPtr>> parameters;
  for (int r = 0; r < s.replicas; ++r) {
    std::vector<std::string> places(workers.begin() + r * stages,
                                    workers.begin() + (r + 1) * stages);
    // One seed for all: every replica starts from the same weights.
    job->replicas.push_back(
        Replica{RemoteUnet::create(plan.depth, s.plan.classes, plan.on(places),
                                   static_cast<int64_t>(s.seed), s.freeze_batchnorm),
                nullptr});
    Replica& replica = job->replicas.back();
    if (s.precision != remote_module::Precision::Float32) {
      for (const remote_module::RemoteModule& stage : replica.split.modules())
        stage.set_precision(s.precision);
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
  job->optimizer = std::make_unique<dist_autograd::DistributedOptimizer>(
      optimizer_spec(s), std::move(parameters), s.bucket_mib);
  return job;
}

remote_module::NamedValues progress_values(const Progress& p) {
  remote_module::NamedValues values{{"epoch", int64_t{p.epoch}},
                                    {"batch", static_cast<int64_t>(p.batch)},
                                    {"loss_sum", p.loss_sum},
                                    {"step", p.step}};
  if (p.monitor) {
    values["monitor"] = p.monitor->metric_name();
    values["best_epoch"] = int64_t{p.monitor->best_epoch()};
    values["best_value"] = p.monitor->best_value();
    values["stale_epochs"] = int64_t{p.monitor->stale_epochs()};
  }
  return values;
}

namespace {

// The optimizer's state and `progress` from the values a checkpoint saved beside the stages.
// `source` names the checkpoint in what the log says.
void restore_progress(StagesOnWorkers& job, const remote_module::NamedValues& extra,
                      const std::string& source, std::size_t epoch_steps, Progress& progress) {
  align_replicas(job);
  job.optimizer->load_state_dict(extra.at("optimizer"));
  progress.epoch = static_cast<int>(extra.at("epoch").toInt());
  // Checkpoints saved only after epochs counted no batches.
  progress.batch = extra.count("batch") ? static_cast<std::size_t>(extra.at("batch").toInt()) : 0;
  progress.loss_sum = extra.count("loss_sum") ? extra.at("loss_sum").toDouble() : 0;
  // Checkpoints written before schedules counted no steps: a step per batch then.
  progress.step = extra.count("step") ? extra.at("step").toInt()
                                      : progress.epoch * static_cast<int64_t>(epoch_steps);
  if (!progress.monitor) return;
  EpochMonitor& monitor = *progress.monitor;
  monitor.restore(0, 0, 0);
  if (!extra.count("monitor")) return;
  if (extra.at("monitor").toStringRef() != monitor.metric_name()) {
    log::warn("{} watched {}; --monitor {} starts afresh", source,
              extra.at("monitor").toStringRef(), monitor.metric_name());
    return;
  }
  monitor.restore(static_cast<int>(extra.at("best_epoch").toInt()),
                  extra.at("best_value").toDouble(),
                  static_cast<int>(extra.at("stale_epochs").toInt()));
}

}  // namespace

std::string restore(StagesOnWorkers& job, const std::string& dir, std::size_t epoch_steps,
                    Progress& progress) {
  const remote_module::SavedCheckpoint saved = remote_module::read_latest_checkpoint(
      dir, [](const std::string& folder, const std::string& why) {
        log::warn("checkpoint {} cannot be used ({}); trying the one before it", folder, why);
      });
  std::map<std::string, at::Tensor> state;
  for (const auto& [stage, tensors] : saved.stages) {
    for (const auto& item : tensors) state[item.key()] = item.value();
  }
  remote_module::load_state_by_tensor_name(std::move(state), job.split().named(),
                                           fmt::format("checkpoint \"{}\"", saved.folder));
  restore_progress(job, saved.extra, fmt::format("the checkpoint {}", saved.folder), epoch_steps,
                   progress);
  return saved.folder;
}

void restore(StagesOnWorkers& job, const remote_module::CheckpointContent& content,
             std::size_t epoch_steps, Progress& progress) {
  std::map<std::string, at::Tensor> state;
  for (const remote_module::CheckpointContent::Stage& stage : content.stages) {
    for (const auto& item : stage.state) state[item.key()] = item.value();
  }
  remote_module::load_state_by_tensor_name(std::move(state), job.split().named(),
                                           "the last checkpoint's state in memory");
  restore_progress(job, content.extra, "the last checkpoint", epoch_steps, progress);
}

namespace {

void move_through_master(std::unique_ptr<StagesOnWorkers>& job, const TrainSettings& s,
                         const StagePlan& to, const std::vector<std::string>& workers) {
  std::map<std::string, at::Tensor> state;
  for (const auto& stage : job->split().stages()) {
    for (const auto& item : stage.module.state_dict()) state[item.key()] = item.value();
  }
  const c10::IValue optimizer = job->optimizer->state_dict();
  // The old stages go first: a worker holds one copy of its blocks at a time.
  job.reset();
  job = build_stages(s, to, workers);
  remote_module::load_state_by_tensor_name(std::move(state), job->split().named(),
                                           "the stages before the move");
  align_replicas(*job);
  job->optimizer->load_state_dict(optimizer);
}

// Each replica's new stages take from that replica's old ones, so each keeps its own batch-norm
// statistics, as it would have without the move.
void move_worker_to_worker(std::unique_ptr<StagesOnWorkers>& job, const TrainSettings& s,
                           const StagePlan& to, const std::vector<std::string>& workers) {
  std::vector<std::vector<rpc::RRefPtr>> parks;
  for (const Replica& replica : job->replicas) {
    parks.push_back(remote_module::park_states(replica.split.modules()));
  }
  const std::vector<dist_autograd::DistributedOptimizer::Parked> optimizer = job->optimizer->park();
  job.reset();
  job = build_stages(s, to, workers);
  for (std::size_t r = 0; r < job->replicas.size(); ++r) {
    for (const RemoteUnet::Stage& stage : job->replicas[r].split.stages()) {
      remote_module::load_parked_state(stage.module, parks[r]);
    }
  }
  job->optimizer->load_parked(optimizer);
}

// For each copy of each stage (replica by replica), the replica whose copy it takes its state
// from; nullopt for a stage none of whose copies stands after the last step.
std::vector<std::vector<std::optional<int>>> peer_sources(const StagesOnWorkers& job) {
  const std::size_t replicas = job.replicas.size();
  std::map<std::pair<int, std::string>, bool> asked;
  auto usable = [&](int r, const std::string& worker) {
    auto [it, fresh] = asked.try_emplace({r, worker}, false);
    if (fresh) it->second = job.optimizer->between_steps(r, worker);
    return it->second;
  };
  std::vector<std::vector<std::optional<int>>> out(replicas);
  for (std::size_t r = 0; r < replicas; ++r) {
    const std::vector<RemoteUnet::Stage>& stages = job.replicas[r].split.stages();
    for (std::size_t k = 0; k < stages.size(); ++k) {
      std::optional<int> source;
      // Its own copy first, then the other replicas' in order.
      for (std::size_t step = 0; step < replicas && !source; ++step) {
        const int from = static_cast<int>((r + step) % replicas);
        if (usable(from, job.replicas[from].split.stages()[k].plan.worker)) source = from;
      }
      out[r].push_back(source);
    }
  }
  return out;
}

}  // namespace

std::vector<PeerSource> rebuild_from_peers(std::unique_ptr<StagesOnWorkers>& job,
                                           const TrainSettings& s, const StagePlan& plan,
                                           const std::vector<std::string>& workers,
                                           std::string& why_not) {
  const std::vector<std::vector<std::optional<int>>> sources = peer_sources(*job);
  std::vector<PeerSource> taken;
  for (std::size_t r = 0; r < sources.size(); ++r) {
    for (std::size_t k = 0; k < sources[r].size(); ++k) {
      if (sources[r][k]) continue;
      why_not = fmt::format(
          "no copy of stage {} stands as it was after optimizer step {} (each was lost, or "
          "stepped on where the step failed elsewhere)",
          job->split().stages()[k].name(), job->optimizer->steps());
      return {};
    }
  }
  // One park per rebuilt copy (a take empties what it takes); the optimizer's once per owner
  // and replica it goes to. All at once.
  std::vector<remote_module::RemoteModule> copies;
  std::vector<dist_autograd::DistributedOptimizer::OwnerPark> owners;
  std::set<std::pair<int, std::string>> owners_parked;
  for (std::size_t r = 0; r < sources.size(); ++r) {
    for (std::size_t k = 0; k < sources[r].size(); ++k) {
      const int from = *sources[r][k];
      const RemoteUnet::Stage& stage = job->replicas[from].split.stages()[k];
      copies.push_back(stage.module);
      if (owners_parked.emplace(static_cast<int>(r), stage.plan.worker).second) {
        owners.push_back({from, stage.plan.worker, static_cast<int>(r)});
      }
      if (from != static_cast<int>(r)) {
        taken.push_back(PeerSource{stage.name(), static_cast<int>(r), from, stage.plan.worker});
      }
    }
  }
  const std::vector<rpc::RRefPtr> parks = remote_module::park_states(copies);
  const std::vector<dist_autograd::DistributedOptimizer::Parked> optimizer =
      job->optimizer->park_owners(owners);
  job.reset();
  job = build_stages(s, plan, workers);
  std::size_t next = 0;
  for (const Replica& replica : job->replicas) {
    for (const RemoteUnet::Stage& stage : replica.split.stages()) {
      remote_module::load_parked_state(stage.module, {parks[next++]});
    }
  }
  job->optimizer->load_parked(optimizer);
  return taken;
}

void move_stages(std::unique_ptr<StagesOnWorkers>& job, const TrainSettings& s, const StagePlan& to,
                 const std::vector<std::string>& workers, Handover handover) {
  if (handover == Handover::WorkerToWorker) {
    move_worker_to_worker(job, s, to, workers);
  } else {
    move_through_master(job, s, to, workers);
  }
}

}  // namespace ferry::trainer
