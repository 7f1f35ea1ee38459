// Checkpoints of a model whose stages live on workers: every stage's parameters and buffers in one
// directory, restorable into stages built anywhere (other workers, another run).
//
// Layout: DIR/ckpt-<n>/<stage>.pt (one pickled state dict per stage, readable by Python's
// torch.load) and DIR/ckpt-<n>/manifest.json, with DIR/LATEST naming the newest complete one.
// Every file is written to a temporary name, flushed to disk and renamed, and LATEST moves only
// after the whole checkpoint is on disk, so a crash during a save leaves the previous checkpoint
// the latest. Called from one thread at a time per directory.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ferry/remote_module/remote_module.h"

namespace ferry {

using NamedStages = std::vector<std::pair<std::string, RemoteModule>>;

// Returns the checkpoint's folder. Keeps the `keep` newest checkpoints, removes older ones.
std::string save_checkpoint(const std::string& dir, const NamedStages& stages, int keep = 2);
// Loads the latest checkpoint of `dir` into `stages` by stage name. Throws rpc::Error naming the
// directory, the stage and what is wrong (no checkpoint, a stage it lacks, a tensor that does
// not fit).
void load_checkpoint(const std::string& dir, const NamedStages& stages);

}  // namespace ferry
