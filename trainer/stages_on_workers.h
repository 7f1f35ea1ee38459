// The model's stages as a run holds them on the master: every replica's stages on their workers
// and the distributed optimizer over them all, built from the plan and the settings (and built
// again as a whole when spares take over); where a run stands between epochs, and how that is
// saved into and restored from a checkpoint. Used from the master's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/dist_autograd/optimizer.h"
#include "ferry/models/remote_unet.h"
#include "ferry/remote_module/checkpoint.h"
#include "ferry/trainer/train.h"
#include "trainer/epoch_monitor.h"
#include "trainer/replicas.h"
#include "trainer/stage_plan.h"

namespace ferry::trainer {

// Every replica of the model's stages on their workers, with the optimizer over them all: built
// again as a whole when spares take over a lost worker's stages.
struct StagesOnWorkers {
  std::vector<Replica> replicas;
  std::unique_ptr<dist_autograd::DistributedOptimizer> optimizer;

  // Replica 0: what checkpoints save and reports show (every replica's parameters are equal).
  models::RemoteUnet& split() { return replicas.front().split; }
  std::vector<const models::RemoteUnet*> splits() const {
    std::vector<const models::RemoteUnet*> out;
    for (const Replica& r : replicas) out.push_back(&r.split);
    return out;
  }
};

// Replica 0's parameters and buffers into every other replica. Their parameters are equal already;
// their batch norms' running statistics are not, each having seen its own images: after this,
// validation and checkpoints see one model, as DistributedDataParallel's broadcast of buffers
// makes it.
void align_replicas(StagesOnWorkers& job);

// Every replica's stages on `workers` (every replica's places, replica by replica, as
// place_stages gives them), from one seed, with --precision, --sync-batchnorm and --weights
// applied, and the optimizer over them all.
std::unique_ptr<StagesOnWorkers> build_stages(const TrainSettings& s, const StagePlan& plan,
                                              const std::vector<std::string>& workers);

// Where a run stands between two optimizer steps: what a checkpoint saves beside the weights and
// the optimizer's state, so that --resume goes on from the next batch, along the same
// learning-rate curve, and keeps its best epoch.
struct Progress {
  int epoch = 0;          // epochs done
  std::size_t batch = 0;  // batches done of the next epoch (at the end of an optimizer step)
  double loss_sum = 0;    // of those batches' losses, for the epoch's mean
  std::int64_t step = 0;  // optimizer steps done
  std::optional<EpochMonitor> monitor;
};

// What a checkpoint saves beside the weights and the optimizer's state ("optimizer"): `p`.
remote_module::NamedValues progress_values(const Progress& p);

// Loads the latest checkpoint in `dir` into replica 0 (read once; the other replicas get its
// tensors) and the optimizer, and `progress` with where it was saved; returns its folder.
// Tensors are found by name, so the checkpoint may come from another cut; the optimizer's state
// is per parameter in the whole model's order, which no cut changes. `epoch_steps`: optimizer
// steps per epoch, for checkpoints that did not count them.
std::string restore(StagesOnWorkers& job, const std::string& dir, std::size_t epoch_steps,
                    Progress& progress);
// The same from a checkpoint's content still in memory (what was last given to the writer).
void restore(StagesOnWorkers& job, const remote_module::CheckpointContent& content,
             std::size_t epoch_steps, Progress& progress);

// How move_stages hands the state over.
enum class Handover {
  // Each new stage's worker takes its tensors straight from the workers that held them
  // (remote_module/state_handover.h); the master holds none of them.
  WorkerToWorker,
  // The master gathers every tensor and sends each to its new stage: no worker holds its old
  // state beside its new one.
  ThroughMaster,
};

// Builds the stages of `to` on `workers` (every replica) in place of `job`'s and moves every
// parameter, buffer and the optimizer's state into them by tensor name, as a resume onto another
// cut restores them, without a checkpoint on disk (trainer/rebalance.h says when). What this
// throws leaves `job` empty: the caller goes back to a checkpoint, as after a lost worker.
void move_stages(std::unique_ptr<StagesOnWorkers>& job, const TrainSettings& s, const StagePlan& to,
                 const std::vector<std::string>& workers, Handover handover);

// Where a stage rebuilt after a lost worker took its state from.
struct PeerSource {
  std::string stage;
  int replica = 0;       // the rebuilt copy's
  int from_replica = 0;  // the copy it took its state from
  std::string from_worker;
};

// After lost workers, with replicas: `job`'s stages built again on `workers` (the lost workers'
// places given to spares), each copy taking its parameters, buffers and optimizer state straight
// from a copy of the same stage that survived as it stood after the last optimizer step: its own
// where it did, else another replica's (whose batch-norm statistics it then has). No step is
// lost. Empty, with `job` as it was, when some stage has no such copy (every copy lost, or gone
// a step on by a step that failed elsewhere) and `why_not` says which; what this throws leaves
// `job` empty.
std::vector<PeerSource> rebuild_from_peers(std::unique_ptr<StagesOnWorkers>& job,
                                           const TrainSettings& s, const StagePlan& plan,
                                           const std::vector<std::string>& workers,
                                           std::string& why_not);

}  // namespace ferry::trainer
