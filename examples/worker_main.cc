// ferry-worker: joins the cluster and hosts whichever stages the master creates on it, until the
// world shuts down or the master is gone. Rank, world size and master come from the environment
// (torchrun's, Slurm's or Open MPI's variables) or from flags.
#include <CLI/CLI.hpp>

#include "ferry/dist_autograd/context.h"
#include "ferry/models/unet.h"
#include "ferry/remote_module/stage_host.h"
#include "ferry/rpc/log.h"
#include "ferry/rpc/rpc.h"

int main(int argc, char** argv) {
  CLI::App app("Ferry worker: hosts model stages for a master");
  ferry::rpc::Options options;
  app.add_option("--name", options.name, "worker name (default: worker<rank>)");
  app.add_option("--rank", options.rank, "rank (default: RANK, SLURM_PROCID, ...)");
  app.add_option("--world-size", options.world_size, "world size (default: WORLD_SIZE, ...)");
  app.add_option("--master-addr", options.master_addr, "master host (default: MASTER_ADDR, ...)");
  app.add_option("--master-port", options.master_port, "master port (default: MASTER_PORT)");
  app.add_option("--threads", options.num_threads, "threads running requests");
  CLI11_PARSE(app, argc, argv);

  ferry::models::register_unet_stages();
  ferry::install_stage_functions(ferry::rpc::default_registry());
  ferry::dist_autograd::install(ferry::rpc::default_registry());
  try {
    ferry::rpc::init(options);
  } catch (const ferry::rpc::Error& e) {
    ferry::log::error("{}", e.what());
    return 2;
  }
  ferry::log::info("{} is up and serving", ferry::rpc::self().describe());
  ferry::rpc::agent().wait_for_shutdown();
  ferry::rpc::shutdown();
  ferry::log::info("shut down");
  return 0;
}
