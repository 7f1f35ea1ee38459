// ferry-world-agent: one agent of the large-world test. It joins one world after another (one
// per port given, all of the same size, rank 0 being the test), calls its neighbour (rank + 1,
// wrapping to 0) in each, checks the answer, and shuts down; it exits 0 only if every world went
// well. The process starts once: LibTorch takes most of a second of CPU to load, which is not
// what the test measures.
#include <CLI/CLI.hpp>
#include <chrono>
#include <sstream>

#include "ferry/rpc/log.h"
#include "ferry/rpc/rpc.h"
#include "tests/support/test_functions.h"

int main(int argc, char** argv) {
  CLI::App app("Ferry large-world test agent");
  int rank = -1, world_size = -1;
  std::string ports;
  app.add_option("--rank", rank)->required();
  app.add_option("--world-size", world_size)->required();
  app.add_option("--ports", ports, "one rendezvous port per world, comma-separated")->required();
  CLI11_PARSE(app, argc, argv);
  ferry::testing::register_test_functions(ferry::rpc::default_registry());
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
    options.init_timeout = std::chrono::seconds(60);
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
