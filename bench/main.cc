// ferry-bench: benchmarks that print one JSON object last.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdlib>
#include <string>

#include "bench/autograd_bench.h"
#include "bench/rpc_bench.h"
#include "ferry/rpc/compute_thread.h"

namespace {

std::string self_path(const char* argv0) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return argv0;
  return std::string(buf, n);
}

}  // namespace

int main(int argc, char** argv) {
  // Every process of a benchmark shares this machine's cores, this one included (it drives the
  // split and trains the one-process baseline). libgomp reads the setting when it loads, so the
  // benchmark starts itself again with it; its workers inherit it. See
  // rpc::kSharedMachineSpinCount.
  if (!std::getenv("GOMP_SPINCOUNT")) {
    setenv("GOMP_SPINCOUNT", ferry::rpc::kSharedMachineSpinCount, 1);
    std::string self = self_path(argv[0]);
    execv(self.c_str(), argv);
  }
  CLI::App app("Ferry benchmarks: each prints one JSON object as its last line");
  app.require_subcommand(1);
  ferry::bench::RpcBenchSettings rpc;
  rpc.self_path = self_path(argv[0]);
  auto* rpc_cmd =
      app.add_subcommand("rpc", "RPC latency, bandwidth and throughput against raw TCP");
  rpc_cmd->add_option("--rtt-iterations", rpc.rtt_iterations, "round trips timed");
  rpc_cmd->add_option("--async-calls", rpc.async_calls, "calls in the throughput run");
  rpc_cmd->add_option("--async-window", rpc.async_window, "calls in flight at once");
  rpc_cmd->add_option("--echo-mib", rpc.echo_mib, "tensor sizes of the echo measurement, MiB");
  rpc_cmd->add_option("--repeats", rpc.repeats, "repeats of each measurement");
  ferry::bench::AutogradBenchSettings autograd;
  autograd.self_path = rpc.self_path;
  auto add_step_options = [&autograd](CLI::App* cmd) {
    cmd->add_option("--depth", autograd.depth, "ResNet depth of the encoder");
    cmd->add_option("--batch", autograd.batch, "images per step");
    cmd->add_option("--image-size", autograd.image_size, "image height and width");
    cmd->add_option("--steps", autograd.steps, "timed steps of each kind");
    cmd->add_option("--warmup", autograd.warmup, "untimed steps first");
    cmd->add_option("--threads", autograd.threads, "intra-op threads per process");
  };
  auto* autograd_cmd = app.add_subcommand(
      "autograd", "U-Net training step split over three workers against one process");
  add_step_options(autograd_cmd);
  auto* train_cmd = app.add_subcommand("train", "the same measurement, named for training");
  add_step_options(train_cmd);
  auto* peer_cmd = app.add_subcommand("rpc-peer", "the peer process of `rpc` (started by it)");
  peer_cmd->group("");
  CLI11_PARSE(app, argc, argv);
  if (*rpc_cmd) return ferry::bench::run_rpc_bench(rpc);
  if (*autograd_cmd) return ferry::bench::run_autograd_bench(autograd);
  if (*train_cmd) {
    autograd.name = "train";
    return ferry::bench::run_autograd_bench(autograd);
  }
  if (*peer_cmd) return ferry::bench::run_rpc_peer();
  return 1;
}
