#include "ferry/trainer/worker_loop.h"

#include <fmt/ranges.h>
#include <torch/cuda.h>

#include <chrono>

#include "ferry/core/compute_thread.h"
#include "ferry/core/device_choice.h"
#include "ferry/core/environment.h"
#include "ferry/core/log.h"
#include "ferry/dist_autograd/context.h"
#include "ferry/models/unet.h"
#include "ferry/pipeline/pipeline.h"
#include "ferry/remote_module/stage_host.h"
#include "ferry/remote_module/stage_plugin.h"
#include "ferry/rpc/rpc.h"

namespace ferry::trainer {
namespace {

// A stage's work may still run when its job has stopped (a master gone mid-step); the process
// exits only once it has ended, or after a bound, since exiting under it crashes in the kernels
// that static destructors free.
void finish_compute() {
  constexpr std::chrono::seconds kBound{30};
  if (!core::stop_compute_thread(kBound)) {
    log::warn("the compute thread is still busy after {} s; exiting under it", kBound.count());
  }
}

}  // namespace

void install_worker_functions() {
  static bool done = [] {
    models::register_unet_stages();
    pipeline::install(rpc::default_registry());
    return true;
  }();
  (void)done;
}

bool load_plugins(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    try {
      log::info("plugin {}: stage types {}", path,
                fmt::join(remote_module::load_stage_plugin(path), ", "));
    } catch (const rpc::Error& e) {
      log::error("{}", e.what());
      return false;
    }
  }
  return true;
}

int serve_as_worker(const rpc::Options& options, const std::string& device) {
  install_worker_functions();
  core::DeviceChoice choice;
  try {
    choice = core::choose_device(device, core::process_environment(),
                                 static_cast<int64_t>(torch::cuda::device_count()));
    remote_module::set_default_device(choice.device);
  } catch (const std::exception& e) {
    log::error("{}", e.what());
    return 2;
  }
  try {
    rpc::init(options);
  } catch (const rpc::Error& e) {
    log::error("{}", e.what());
    return 2;
  }
  log::info("{} is up and serving; its stages compute on {} ({})", rpc::self().describe(),
            choice.device, choice.reason);
  rpc::agent().wait_for_shutdown();
  rpc::shutdown();
  finish_compute();
  log::info("shut down");
  return 0;
}

int exit_code_of(std::exception_ptr error, int otherwise) {
  return rpc::failure_of(error).kind == rpc::ErrorKind::OutOfMemory ? kExitOutOfMemory : otherwise;
}

int run_as_master(rpc::Options options, const std::string& what, const std::function<int()>& job,
                  const std::function<std::string(const rpc::Failure&)>& explain) {
  install_worker_functions();
  options.name = "master";
  try {
    rpc::init(options);
  } catch (const rpc::Error& e) {
    log::error("{}", e.what());
    return 2;
  }
  int code = 1;
  try {
    code = job();
  } catch (const std::exception&) {
    const rpc::Failure failure = rpc::failure_of(std::current_exception());
    log::error("{} failed: {}{}", what, failure.message, explain ? explain(failure) : "");
    code = exit_code_of(std::current_exception(), 1);
  }
  rpc::shutdown(code == 0);
  finish_compute();
  return code;
}

}  // namespace ferry::trainer
