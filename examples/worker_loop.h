// What a worker process does with its life, shared by ferry-worker and by ferry-master on ranks
// other than 0.
#pragma once

#include <string>
#include <vector>

#include "ferry/rpc/options.h"

namespace ferry::examples {

// Installs the stage functions, the U-Net stages, distributed autograd and the pipeline into the
// default registry (once per process). Every process of a training world needs them, master
// included.
void install_worker_functions();

// Loads each stage plugin (ferry/remote_module/stage_plugin.h) and logs the types it brings;
// false, with the error logged, if one fails.
bool load_plugins(const std::vector<std::string>& paths);

// Joins the world and serves until the master shuts it down (0) or is gone; 2 if it cannot join.
int serve_as_worker(const rpc::Options& options);

}  // namespace ferry::examples
