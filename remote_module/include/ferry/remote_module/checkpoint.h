// Checkpoints of a model whose stages live on workers: every stage's parameters and buffers in one
// directory, restorable into stages built anywhere (other workers, another run).
//
// Layout: DIR/ckpt-<n>/<stage>.pt (one pickled state dict per stage, readable by Python's
// torch.load) and DIR/ckpt-<n>/manifest.json (each file with its size and BLAKE2b digest), with
// DIR/LATEST naming the newest complete one.
// Every file is written to a temporary name, flushed to disk and renamed, and LATEST moves only
// after the whole checkpoint is on disk, so a crash during a save leaves the previous checkpoint
// the latest. Called from one thread at a time per directory.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ferry/remote_module/remote_module.h"

namespace ferry::remote_module {

using NamedStages = std::vector<std::pair<std::string, RemoteModule>>;
// Other values saved beside the stages, by name: the optimizer's state, the step reached.
using NamedValues = std::map<std::string, c10::IValue>;

// Returns the checkpoint's folder. Keeps the `keep` newest checkpoints, removes older ones.
// Each of `extra` goes to DIR/ckpt-<n>/<name>.pt; its names must differ from the stages'.
std::string save_checkpoint(const std::string& dir, const NamedStages& stages, int keep = 2,
                            const NamedValues& extra = {});

// What a checkpoint holds, taken from its stages at one moment: each stage's tensors (copies:
// the stages may go on training while it is written), and the values beside them. Value type.
struct CheckpointContent {
  struct Stage {
    std::string name, type, worker;
    c10::Dict<std::string, at::Tensor> state;
  };
  std::vector<Stage> stages;
  NamedValues extra;
};
// Takes every stage's tensors now. rpc::Error when `extra` has a stage's name.
CheckpointContent gather_checkpoint(const NamedStages& stages, NamedValues extra = {});
// gather_checkpoint in two halves, so that a running job waits only for the copies: each stage's
// state is copied now on its own worker (this returns once every copy is made), and the returned
// function brings the copies here, with `extra` and each of `deferred`'s values, from any thread
// (a CheckpointWriter::Take). It throws rpc::Error naming the stage and worker when a copy cannot
// be made or brought here (its worker was lost).
std::function<CheckpointContent()> take_checkpoint(
    const NamedStages& stages, NamedValues extra,
    std::map<std::string, std::function<c10::IValue()>> deferred = {});
// Writes `content` into `dir` as save_checkpoint does and returns its folder.
std::string write_checkpoint(const std::string& dir, const CheckpointContent& content,
                             int keep = 2);

// Loads the latest checkpoint of `dir` into `stages` by stage name and returns the extra values
// saved with it. Throws rpc::Error naming the directory, the stage and what is wrong (no
// checkpoint, a stage it lacks, a tensor that does not fit).
NamedValues load_checkpoint(const std::string& dir, const NamedStages& stages);
// As load_checkpoint, but by tensor name whichever stage saved each tensor: for models whose
// tensor names do not depend on the cut (a U-Net's block ranges), so that a run resumes on
// another number of stages. Every tensor of every stage must be in the checkpoint and every saved
// tensor must find a stage; errors name the directory, the stage and the tensors.
NamedValues load_checkpoint_by_tensor_name(const std::string& dir, const NamedStages& stages);

// Loads `state` (a whole model's tensors by name) into `stages`, each taking the tensors its own
// state dict names: what a checkpoint of another cut saved, or a running job's stages cut anew.
// Every tensor of every stage must be in `state` and every tensor in `state` must find a stage;
// otherwise nothing is loaded and rpc::Error names `source` ("checkpoint \"DIR/ckpt-3\""), the
// stage and the tensors.
void load_state_by_tensor_name(std::map<std::string, at::Tensor> state, const NamedStages& stages,
                               const std::string& source);

// A checkpoint as its files hold it, without stages to load it into: to export it or look at it.
struct SavedCheckpoint {
  std::string folder;
  // Each stage's tensors, in the order the stages were saved.
  std::vector<std::pair<std::string, c10::Dict<std::string, at::Tensor>>> stages;
  NamedValues extra;
};
// The complete checkpoints of `dir` (those with a manifest), oldest first; none when `dir` is
// not there.
std::vector<std::string> checkpoint_folders(const std::string& dir);
// Whether `dir` holds a complete checkpoint (has a LATEST).
bool has_checkpoint(const std::string& dir);
// The folder that `dir`'s LATEST names; rpc::Error(InvalidArgument) naming `dir` if none.
std::string latest_checkpoint_folder(const std::string& dir);
// Reads a checkpoint folder; rpc::Error(InvalidArgument) naming the folder or file if a file is
// missing or unreadable.
SavedCheckpoint read_checkpoint(const std::string& folder);
// The newest checkpoint of `dir` that reads whole: the one LATEST names, or where a file of it is
// missing, unreadable or not what the manifest says of it (its size and BLAKE2b digest), the
// newest one before it that is; `skipped` hears each folder passed over and why. rpc::Error
// naming `dir` and every reason when none reads.
SavedCheckpoint read_latest_checkpoint(
    const std::string& dir,
    const std::function<void(const std::string& folder, const std::string& why)>& skipped = {});
// One of the values saved beside the stages (see save_checkpoint's `extra`), without reading the
// rest; rpc::Error(InvalidArgument) naming the folder and the value if it has none such.
c10::IValue read_checkpoint_value(const std::string& folder, const std::string& name);
// Every stage's tensors of `checkpoint` as one state dict, in stage order: what one model holding
// all the stages would save. Two stages with a tensor of the same name are an error naming both.
c10::Dict<std::string, at::Tensor> merged_state(const SavedCheckpoint& checkpoint);
// Writes `state` to `path` in torch.save's format (Python's torch.load reads it as a dict of
// tensors), so that `path` holds either its old content or all of the new.
void save_state_dict(const c10::Dict<std::string, at::Tensor>& state, const std::string& path);

}  // namespace ferry::remote_module
