// The worker's side of remote modules: the functions through which a master builds stages on
// this worker and drives them. A worker process installs them once, before rpc::init().
#pragma once

#include "ferry/rpc/registry.h"

namespace ferry {

// Adds the "ferry.stage.*" functions to `registry` (normally rpc::default_registry()).
void install_stage_functions(rpc::FunctionRegistry& registry);

}  // namespace ferry
