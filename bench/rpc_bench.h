// `ferry-bench rpc`: latency and bandwidth of the agent against raw TCP between the same two
// processes on loopback, in the same run.
#pragma once

#include <string>
#include <vector>

namespace ferry::bench {

struct RpcBenchSettings {
  int rtt_iterations = 2000;
  int async_calls = 20000;
  int async_window = 500;
  std::vector<int> echo_mib = {1, 16, 64};  // tensor sizes of the echo measurement
  int echo_repeats = 21;                    // of each echo size; medians are reported
  int repeats = 5;                          // of the throughput measurement; medians are reported
  std::string self_path;                    // this binary, started again as the peer
};

// Runs the benchmark as rank 0 and prints one JSON object last. Returns the exit code.
int run_rpc_bench(const RpcBenchSettings& settings);
// The peer's side: serves add/echo and a raw echo server until rank 0 shuts down.
int run_rpc_peer();

}  // namespace ferry::bench
