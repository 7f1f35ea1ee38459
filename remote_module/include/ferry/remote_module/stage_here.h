// A stage owned by this worker, for a layer above that drives it itself (the pipeline runs one
// micro-batch's forward and backward at a time on the stage's worker). `module` is a
// RemoteModule's module_rref() as it arrives here; each function throws rpc::Error if it is not a
// stage this worker owns.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

#include "ferry/rpc/rref.h"

namespace ferry::remote_module {

// One forward on the compute thread, under the caller's grad mode, counted in the stage's stats;
// its failure is an rpc::Error naming the stage and this worker.
c10::IValue forward_stage_here(const rpc::RRefPtr& module, const c10::IValue& inputs);
// The stage's parameters, in named_parameters() order.
std::vector<at::Tensor> stage_parameters_here(const rpc::RRefPtr& module);
// The stage's buffers (batch norms' running statistics), in named_buffers() order.
std::vector<at::Tensor> stage_buffers_here(const rpc::RRefPtr& module);
// The stage's type, as errors name it.
std::string stage_type_here(const rpc::RRefPtr& module);
// Its parameters and buffers by name, detached, sharing their storage (no copy).
c10::Dict<std::string, at::Tensor> stage_state_here(const rpc::RRefPtr& module);
// Loads the stage's parameters and buffers from `state` on the compute thread (`strict`: all of
// them and nothing else); a mismatch names the stage and this worker.
void load_stage_state_here(const rpc::RRefPtr& module,
                           const c10::Dict<std::string, at::Tensor>& state, bool strict);

}  // namespace ferry::remote_module
