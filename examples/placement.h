// Where the training job's stages go and what it says and does when a worker is lost: the
// placement over the world's workers, the spares that take over, and the message naming the
// stages a lost worker held. Used from the master's thread.
#pragma once

#include <string>
#include <vector>

#include "examples/stage_plan.h"
#include "ferry/models/remote_unet.h"
#include "ferry/rpc/error.h"

namespace ferry::examples {

// The worker of each planned stage: round robin over the workers that are not spares (the master
// hosts them all in a world of one), then --placement's choices.
std::vector<std::string> place_stages(const StagePlan& plan, const std::string& placement,
                                      int spares);

// Puts a spare in place of every lost worker that held a stage; says what it did, one line per
// worker, or nothing when there is no such worker or not enough spares (then the job fails).
std::vector<std::string> take_over_lost_workers(const StagePlan& plan,
                                                std::vector<std::string>& workers,
                                                std::vector<std::string>& spares);

// What a user needs after a worker is lost, unreachable or out of memory: the stages it holds,
// and where training can resume from. Empty for other errors.
std::string stages_concerned(const rpc::Error& e, const models::RemoteUnet& split,
                             const std::string& checkpoint_dir);

}  // namespace ferry::examples
