// Where the training job's stages go and what it says and does when a worker is lost: the
// placement over the world's workers, the spares that take over, and the message naming the
// stages a lost worker held. Used from the master's thread.
#pragma once

#include <string>
#include <vector>

#include "ferry/models/remote_unet.h"
#include "ferry/rpc/error.h"
#include "trainer/stage_plan.h"

namespace ferry::trainer {

// The names of every copy of every stage, replica by replica: "encoder" for replica 0,
// "encoder@1" for replica 1, ...
std::vector<std::string> replica_stage_names(const StagePlan& plan, int replicas);

// The names of the world's workers by rank (rpc::workers()): the master first.
std::vector<std::string> world_names();

// The worker of each copy of each planned stage, replica by replica (as replica_stage_names), in
// a world of the workers `world` names by rank: the workers that are not spares (the last
// ranks), shared equally among the replicas, each replica's stages round robin over its own (the
// master hosts them all in a world of one); then --placement's choices by those names. Throws
// rpc::Error(InvalidArgument) when a replica gets no worker or --placement names no worker.
std::vector<std::string> place_stages(const StagePlan& plan, const std::string& placement,
                                      int spares, int replicas,
                                      const std::vector<std::string>& world);

// A spare in place of a lost worker: the stages it took over. Value type.
struct TakenOver {
  std::string lost, spare;
  std::vector<std::string> stages;
  // "worker "worker2" was lost; spare "worker4" takes over stage decoder, head"
  std::string describe() const;
};

// Puts a spare in place of every `lost` worker (rpc::Agent::lost_workers) that held a stage;
// says what it did, one per worker, or nothing when there is no such worker or not enough
// spares (then the job fails). `stage_names` and `workers` are as replica_stage_names and
// place_stages give them.
std::vector<TakenOver> take_over_lost_workers(const std::vector<std::string>& stage_names,
                                              std::vector<std::string>& workers,
                                              std::vector<std::string>& spares,
                                              const std::vector<std::string>& lost);

// What a user needs after a worker is lost, unreachable or out of memory: the stages it holds,
// and where training can resume from. Empty for other errors.
std::string stages_concerned(const rpc::Error& e,
                             const std::vector<const models::RemoteUnet*>& replicas,
                             const std::string& checkpoint_dir);

}  // namespace ferry::trainer
