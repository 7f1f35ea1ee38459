// A stage owned by this worker, driven by a layer above that runs it itself (the pipeline runs one
// micro-batch's forward and backward at a time). Internal to remote_module and the pipeline; not
// installed. `module` is a RemoteModule's module_rref() as it arrives here; each throws rpc::Error
// if it is not a stage this worker owns.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

#include "ferry/rpc/registry.h"
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

// "ferry.stage.forward_chain" (stage_chain.cc), which stage_host.cc's install() adds.
void install_stage_chain(rpc::FunctionRegistry& registry);

}  // namespace ferry::remote_module
