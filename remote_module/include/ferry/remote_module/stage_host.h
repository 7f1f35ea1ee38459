// The worker's side of remote modules: the functions through which a master builds stages on
// this worker and drives them. A process installs them before rpc::init(), or installs every
// layer's functions at once with ferry::pipeline::install.
#pragma once

#include <string>

#include "ferry/rpc/registry.h"

namespace ferry::remote_module {

// Adds the "ferry.stage.*" and "ferry.portal.*" functions to `registry` (normally
// rpc::default_registry()). A second call does nothing.
void install(rpc::FunctionRegistry& registry);

// Stages built on this process from now on compute on `device` ("cpu", "cuda:1"), as a worker's
// --device chose (core::choose_device); RemoteModule::to still moves one elsewhere. Throws
// rpc::Error(InvalidArgument) for a device this process does not have.
void set_default_device(const std::string& device);

}  // namespace ferry::remote_module
