// ferry-test-peer: a worker process for the multi-process tests. It takes its rank, world size
// and master from the environment (as ferry-worker does), serves the test functions, and exits
// when the world shuts down or its master is gone.
#include <CLI/CLI.hpp>
#include <chrono>

#include "ferry/core/log.h"
#include "ferry/rpc/rpc.h"
#include "tests/support/test_functions.h"
#include "tests/support/time_scale.h"

namespace {

// With --worlds N: one agent of the large-world test. It joins N worlds one after another (all
// of the same size, rank 0 being the test), calls its neighbour (rank + 1, wrapping to 0) in each,
// checks the answer, and shuts down; 0 only if every world went well. World w's rendezvous port
// appears as the file PORT_DIR/w when the test's rank 0 opens it, with a port from the system.
// The process starts once: LibTorch takes most of a second of CPU to load, which is not what the
// test measures.
int join_worlds(int rank, int world_size, int worlds, const std::string& port_dir) {
  auto name_of = [](int r) { return r == 0 ? std::string("master") : "agent" + std::to_string(r); };
  for (int world = 0; world < worlds; ++world) {
    const std::string file = port_dir + "/" + std::to_string(world);
    // Rank 0's store takes its port from the system when the world opens and writes it there.
    ferry::rpc::Options options = ferry::rpc::loopback_options(name_of(rank), rank, world_size, 0);
    options.master_port_file = file;
    options.num_threads = 1;
    options.rpc_timeout = std::chrono::seconds(20);
    options.init_timeout = ferry::testing::scaled(std::chrono::seconds(60));
    options.shutdown_timeout = std::chrono::seconds(20);
    try {
      ferry::rpc::init(options);
      std::string neighbour = name_of((rank + 1) % world_size);
      std::string answer = ferry::rpc::rpc_sync(neighbour, "whoami", {}).toStringRef();
      if (answer != neighbour) {
        ferry::log::error("world {}: {} answered as {}", world, neighbour, answer);
        return 1;
      }
      ferry::rpc::shutdown(true);
    } catch (const std::exception& e) {
      ferry::log::error("world {}: {}", world, e.what());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Ferry test peer");
  ferry::rpc::Options options;
  int timeout_ms = 20000;
  app.add_option("--name", options.name, "worker name");
  app.add_option("--threads", options.num_threads, "pool threads");
  app.add_option("--init-timeout-ms", timeout_ms, "rendezvous timeout");
  int rpc_timeout_ms = 20000, shutdown_timeout_ms = 20000;
  app.add_option("--rpc-timeout-ms", rpc_timeout_ms, "default call deadline");
  app.add_option("--shutdown-timeout-ms", shutdown_timeout_ms, "graceful shutdown bound");
  int world_rank = -1, world_size = -1;
  int worlds = 0;
  std::string port_dir;
  app.add_option("--world-rank", world_rank, "large-world test: this agent's rank");
  app.add_option("--world-size", world_size, "large-world test: agents per world");
  app.add_option("--worlds", worlds, "large-world test: worlds to join, one after another");
  app.add_option("--port-dir", port_dir, "large-world test: where each world's port appears");
  CLI11_PARSE(app, argc, argv);
  if (worlds > 0) {
    ferry::testing::register_test_functions(ferry::rpc::default_registry());
    return join_worlds(world_rank, world_size, worlds, port_dir);
  }
  options.init_timeout = std::chrono::milliseconds(timeout_ms);
  options.rpc_timeout = std::chrono::milliseconds(rpc_timeout_ms);
  options.shutdown_timeout = std::chrono::milliseconds(shutdown_timeout_ms);

  ferry::testing::register_test_functions(ferry::rpc::default_registry());
  try {
    ferry::rpc::init(options);
  } catch (const ferry::rpc::Error& e) {
    ferry::log::error("{}", e.what());
    return 2;
  }
  ferry::rpc::agent().wait_for_shutdown();
  ferry::rpc::shutdown();
  return 0;
}
