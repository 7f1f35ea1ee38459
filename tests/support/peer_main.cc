// ferry-test-peer: a worker process for the multi-process tests. It takes its rank, world size
// and master from the environment (as ferry-worker does), serves the test functions, and exits
// when the world shuts down or its master is gone.
#include <CLI/CLI.hpp>

#include "ferry/rpc/log.h"
#include "ferry/rpc/rpc.h"
#include "tests/support/test_functions.h"

int main(int argc, char** argv) {
  CLI::App app("Ferry test peer");
  ferry::rpc::Options options;
  int timeout_ms = 20000;
  app.add_option("--name", options.name, "worker name");
  app.add_option("--threads", options.num_threads, "pool threads");
  app.add_option("--init-timeout-ms", timeout_ms, "rendezvous timeout");
  CLI11_PARSE(app, argc, argv);
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
