// The worker's side of remote modules: the functions through which a master builds stages on
// this worker and drives them. A process installs them before rpc::init(), or installs every
// layer's functions at once with ferry::pipeline::install.
#pragma once

#include "ferry/rpc/registry.h"

namespace ferry::remote_module {

// Adds the "ferry.stage.*" and "ferry.portal.*" functions to `registry` (normally
// rpc::default_registry()). A second call does nothing.
void install(rpc::FunctionRegistry& registry);

}  // namespace ferry::remote_module
