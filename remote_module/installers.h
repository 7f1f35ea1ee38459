// What remote_module's own files share and install() puts together; not installed.
#pragma once

#include <string>
#include <vector>

#include "ferry/rpc/registry.h"

namespace ferry::remote_module {

// The first few of `names` and how many more, for errors (checkpoint.cc).
std::string first_names(const std::vector<std::string>& names);

// "ferry.stage.park", "ferry.stage.take_parked", "ferry.stage.load_parked"
// (state_handover.cc), which stage_host.cc's install() adds.
void install_state_handover(rpc::FunctionRegistry& registry);

// "ferry.stage.forward_chain" (stage_chain.cc), which stage_host.cc's install() adds.
void install_stage_chain(rpc::FunctionRegistry& registry);

// Adds the "ferry.portal.*" functions to `registry` (stage_host.cc's install() adds them).
void install_portal_functions(rpc::FunctionRegistry& registry);

}  // namespace ferry::remote_module
