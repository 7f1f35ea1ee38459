#include "examples/worker_loop.h"

#include <fmt/ranges.h>

#include "ferry/core/log.h"
#include "ferry/core/message_of.h"
#include "ferry/dist_autograd/context.h"
#include "ferry/models/unet.h"
#include "ferry/pipeline/pipeline.h"
#include "ferry/remote_module/stage_host.h"
#include "ferry/remote_module/stage_plugin.h"
#include "ferry/rpc/rpc.h"

namespace ferry::examples {

void install_worker_functions() {
  static bool done = [] {
    models::register_unet_stages();
    remote_module::install_stage_functions(rpc::default_registry());
    dist_autograd::install(rpc::default_registry());
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

int serve_as_worker(const rpc::Options& options) {
  install_worker_functions();
  try {
    rpc::init(options);
  } catch (const rpc::Error& e) {
    log::error("{}", e.what());
    return 2;
  }
  log::info("{} is up and serving", rpc::self().describe());
  rpc::agent().wait_for_shutdown();
  rpc::shutdown();
  log::info("shut down");
  return 0;
}

int run_as_master(rpc::Options options, const std::string& what, const std::function<int()>& job,
                  const std::function<std::string(std::string)>& explain) {
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
  } catch (const std::exception& e) {
    std::string message = core::message_of(e);
    log::error("{} failed: {}", what, explain ? explain(std::move(message)) : message);
  }
  rpc::shutdown(code == 0);
  return code;
}

}  // namespace ferry::examples
