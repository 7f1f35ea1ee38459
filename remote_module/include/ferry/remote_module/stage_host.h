// The worker's side of remote modules: the functions through which a master builds stages on
// this worker and drives them. A worker process installs them once, before rpc::init().
#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

#include "ferry/rpc/registry.h"
#include "ferry/rpc/rref.h"

namespace ferry::remote_module {

// Adds the "ferry.stage.*" functions to `registry` (normally rpc::default_registry()).
void install_stage_functions(rpc::FunctionRegistry& registry);

// For layers above that drive a stage owned by this worker themselves (the pipeline runs one
// micro-batch's forward and backward at a time). `module` is a RemoteModule's module_rref() as
// it arrives here; each throws rpc::Error if it is not a stage this worker owns.
// One forward on the compute thread, under the caller's grad mode, counted in the stage's stats;
// its failure is an rpc::Error naming the stage and this worker.
c10::IValue forward_stage_here(const rpc::RRefPtr& module, const c10::IValue& inputs);
// The stage's parameters, in named_parameters() order.
std::vector<at::Tensor> stage_parameters_here(const rpc::RRefPtr& module);
// The stage's type, as errors name it.
std::string stage_type_here(const rpc::RRefPtr& module);

}  // namespace ferry::remote_module
