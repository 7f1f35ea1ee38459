// What a process of a world does with its life: a worker's, shared by ferry-worker and by
// ferry-master on ranks other than 0, and rank 0's as the master of a job.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "ferry/rpc/error.h"
#include "ferry/rpc/options.h"

namespace ferry::trainer {

// The exit code of a job that ran out of memory (a device's, or the tensor memory budget's), so
// that a script or `ferry-bench memory` tells it from other failures without reading the log;
// ferry-launch passes rank 0's code on. Other failures exit 1, bad settings 2.
inline constexpr int kExitOutOfMemory = 3;

// kExitOutOfMemory for an exception of kind rpc::ErrorKind::OutOfMemory, else `otherwise`.
int exit_code_of(std::exception_ptr error, int otherwise);

// Installs the stage functions, the U-Net stages, distributed autograd and the pipeline into the
// default registry (once per process). Every process of a training world needs them, master
// included.
void install_worker_functions();

// Loads each stage plugin (ferry/remote_module/stage_plugin.h) and logs the types it brings;
// false, with the error logged, if one fails.
bool load_plugins(const std::vector<std::string>& paths);

// Joins the world and serves until the master shuts it down (0) or is gone; 2 if it cannot join
// or has no `device` (core::choose_device: "auto" takes the GPU of this process's local rank, or
// the CPU where there is none), where the stages built on it compute.
int serve_as_worker(const rpc::Options& options, const std::string& device = "auto");

// Joins the world as its master (rank 0, named "master", every worker function installed), runs
// `job` and shuts the world down, gracefully when `job` returned 0. Returns what `job` returned;
// 2 if the world cannot be joined; if `job` threw, exit_code_of(it, 1), logged as
// "<what> failed: <message>" (`explain` adds what the user can do about that kind of failure).
int run_as_master(rpc::Options options, const std::string& what, const std::function<int()>& job,
                  const std::function<std::string(const rpc::Failure&)>& explain = nullptr);

}  // namespace ferry::trainer
