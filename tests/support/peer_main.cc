// ferry-test-peer: a worker process for the multi-process tests. It takes its rank, world size
// and master from the environment (as ferry-worker does), serves the test functions, and exits
// when the world shuts down or its master is gone.
#include <CLI/CLI.hpp>
#include <chrono>
#include <sstream>

#include "ferry/core/log.h"
#include "ferry/rpc/rpc.h"
#include "tests/support/sanitizer_allowance.h"
#include "tests/support/test_functions.h"

namespace {

// With --worlds: one agent of the large-world test. It joins one world after another (one per
// port given, all of the same size, rank 0 being the test), calls its neighbour (rank + 1,
// wrapping to 0) in each, checks the answer, and shuts down; 0 only if every world went well.
// The process starts once: LibTorch takes most of a second of CPU to load, which is not what the
// test measures.
int join_worlds(int rank, int world_size, const std::string& ports) {
  auto name_of = [](int r) { return r == 0 ? std::string("master") : "agent" + std::to_string(r); };
  std::stringstream list(ports);
  std::string port;
  int world = 0;
  while (std::getline(list, port, ',')) {
    ferry::rpc::Options options;
    options.name = name_of(rank);
    options.rank = rank;
    options.world_size = world_size;
    options.master_addr = "127.0.0.1";
    options.master_port = std::stoi(port);
    options.num_threads = 1;
    options.rpc_timeout = std::chrono::seconds(20);
    options.init_timeout = std::chrono::seconds(60 * ferry::testing::kSanitizerSlowdown);
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
    ++world;
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
  int world_rank = -1, world_size = -1;
  std::string worlds;
  app.add_option("--world-rank", world_rank, "large-world test: this agent's rank");
  app.add_option("--world-size", world_size, "large-world test: agents per world");
  app.add_option("--worlds", worlds, "large-world test: one rendezvous port per world");
  CLI11_PARSE(app, argc, argv);
  if (!worlds.empty()) {
    ferry::testing::register_test_functions(ferry::rpc::default_registry());
    return join_worlds(world_rank, world_size, worlds);
  }
  options.init_timeout = std::chrono::milliseconds(timeout_ms);
  options.shutdown_timeout = std::chrono::milliseconds(timeout_ms);

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
