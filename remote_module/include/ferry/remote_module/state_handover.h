// A stage's state handed to other stages worker to worker, by tensor name: what a running job
// needs to cut its model anew without a checkpoint on disk and without gathering the model in
// one process (load_state_by_tensor_name is the same through the caller). The old stage parks
// its parameters and buffers on its worker (no copy), and may then be dropped; each new stage's
// worker takes the tensors it needs straight from the parks' workers; the parks are freed with
// their last RRef.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ferry/remote_module/remote_module.h"
#include "ferry/rpc/rref.h"

namespace ferry::remote_module {

// `stage`'s parameters and buffers, kept on its worker under the returned RRef (there once this
// returns: the stage may then be dropped).
rpc::RRefPtr park_state(const RemoteModule& stage);
// park_state of each of `stages`, all at once.
std::vector<rpc::RRefPtr> park_states(const std::vector<RemoteModule>& stages);

// A copy of `stage`'s parameters and buffers taken now on its worker (in host memory) and held
// there under the returned RRef, which is ready once the copy is made; bring_snapshot brings it
// here, from any thread, while the stage trains on. Call it between steps.
rpc::RRefPtr snapshot_state(const RemoteModule& stage);
// The copies `snapshots` hold, taken from their workers a few MiB a call, all workers at once, so
// that the steps' own calls on those connections go on between the parts. Once. rpc::Error
// naming `label(k)` ("stage \"decoder\" on worker \"b\"") where the k-th could not be brought.
std::vector<c10::Dict<std::string, at::Tensor>> bring_snapshots(
    const std::vector<rpc::RRefPtr>& snapshots,
    const std::function<std::string(std::size_t)>& label);

// Every parameter and buffer of `stage` from `parks` (each from the first that holds it), which
// its worker fetches itself. Throws rpc::Error(InvalidArgument) naming the stage, its worker and
// the tensors that no park holds, and then loads nothing.
void load_parked_state(const RemoteModule& stage, const std::vector<rpc::RRefPtr>& parks);

}  // namespace ferry::remote_module
