// ferry-worker: joins the cluster and hosts whichever stages the master creates on it, until the
// world shuts down or the master is gone. Rank, world size and master come from the environment
// (torchrun's, Slurm's or Open MPI's variables) or from flags. Stage types beyond Ferry's own come
// from plugins (--plugin).
#include <CLI/CLI.hpp>

#include "apps/flag_ranges.h"
#include "ferry/core/process_memory.h"
#include "ferry/trainer/worker_loop.h"

int main(int argc, char** argv) {
  CLI::App app("Ferry worker: hosts model stages for a master");
  app.option_defaults()->always_capture_default();
  ferry::rpc::Options options;
  app.add_option("--name", options.name, "worker name (default: worker<rank>)");
  app.add_option("--rank", options.rank, "rank (-1: RANK, SLURM_PROCID, ...)")
      ->check(ferry::apps::in_range(0, 1 << 20));
  app.add_option("--world-size", options.world_size, "world size (-1: WORLD_SIZE, ...)")
      ->check(ferry::apps::count_up_to(1 << 20));
  app.add_option("--master-addr", options.master_addr, "master host (default: MASTER_ADDR, ...)");
  app.add_option("--master-port", options.master_port, "master port (-1: MASTER_PORT)")
      ->check(ferry::apps::count_up_to(65535));
  app.add_option("--threads", options.num_threads, "threads running requests")
      ->check(ferry::apps::count_up_to(1024));
  app.add_option("--secret-file", options.secret_file,
                 "file holding the cluster secret (default: FERRY_SECRET, FERRY_SECRET_FILE)");
  int64_t memory_budget_mib = 0;
  app.add_option("--memory-budget-mib", memory_budget_mib,
                 "tensor memory bound of this process, as a device's (0: "
                 "FERRY_MEMORY_BUDGET_MIB, else none)")
      ->check(ferry::apps::in_range(1, 1ll << 40));
  std::string device = "auto";
  app.add_option("--device", device,
                 "where the stages built here compute: auto (the GPU of this process's local "
                 "rank, LOCAL_RANK, SLURM_LOCALID or OMPI_COMM_WORLD_LOCAL_RANK, modulo the "
                 "visible ones; the CPU without one), cpu, cuda or cuda:N")
      ->check(ferry::apps::device_name());
  std::vector<std::string> plugins;
  app.add_option("--plugin", plugins,
                 "a shared library of stage types to host (FERRY_REGISTER_STAGE); repeatable");
  CLI11_PARSE(app, argc, argv);
  if (memory_budget_mib > 0) ferry::core::set_tensor_memory_budget(memory_budget_mib << 20);
  if (!ferry::trainer::load_plugins(plugins)) return 2;

  return ferry::trainer::serve_as_worker(options, device);
}
