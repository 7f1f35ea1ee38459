// What a process of a world does with its life: a worker's, shared by ferry-worker and by
// ferry-master on ranks other than 0, and rank 0's as the master of a job.
#pragma once

#include <exception>
#include <functional>
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

// Joins the world as its master (rank 0, named "master", every worker function installed), runs
// `job` and shuts the world down, gracefully when `job` returned 0. Returns what `job` returned;
// 2 if the world cannot be joined; 1 if `job` threw, logged as "<what> failed: <message>" (the
// message rewritten by `explain` where given).
int run_as_master(rpc::Options options, const std::string& what, const std::function<int()>& job,
                  const std::function<std::string(std::string)>& explain = nullptr);

}  // namespace ferry::examples
