// Both processes run this file: rank 0 drives (run_rpc_bench), rank 1 serves (run_rpc_peer).
#include "bench/rpc_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/processes.h"
#include "bench/raw_tcp.h"
#include "bench/stats.h"
#include "ferry/core/local_world.h"
#include "ferry/core/log.h"
#include "ferry/rpc/rpc.h"

namespace ferry::bench {
namespace {

void register_bench_functions() {
  auto& registry = rpc::default_registry();
  registry.add("add", [](at::Tensor a, at::Tensor b) { return a + b; });
  registry.add("echo", [](c10::IValue v) { return v; });
  registry.add_inline("add_inline", [](std::vector<c10::IValue>& args) {
    return c10::IValue(args.at(0).toTensor() + args.at(1).toTensor());
  });
}

}  // namespace

int run_rpc_peer() {
  register_bench_functions();
  RawEchoServer raw("127.0.0.1");
  rpc::default_registry().add("raw_port", [&raw]() { return static_cast<int64_t>(raw.port()); });
  rpc::init();
  rpc::agent().wait_for_shutdown();
  rpc::shutdown();
  return 0;
}

namespace {

// Round trip of a small call, plain and inline, against a raw TCP ping-pong of a similar size.
void measure_round_trips(const RpcBenchSettings& settings, const std::string& to,
                         RawEchoClient& raw, std::vector<char>& buffer,
                         nlohmann::ordered_json& out) {
  at::Tensor small = torch::randn({10});
  for (int i = 0; i < 200; ++i) rpc::rpc_sync(to, "add", {small, small});
  // The same call registered inline (served on the peer's loop thread), alternating with it.
  for (int i = 0; i < 200; ++i) rpc::rpc_sync(to, "add_inline", {small, small});
  std::vector<double> rtt, rtt_inline;
  for (int i = 0; i < settings.rtt_iterations; ++i) {
    rtt.push_back(1e6 * seconds_of([&] { rpc::rpc_sync(to, "add", {small, small}); }));
    rtt_inline.push_back(1e6 * seconds_of([&] {
                           rpc::rpc_sync(to, "add_inline", {small, small});
                         }));
  }
  for (int i = 0; i < 200; ++i) raw.echo(buffer, 80);
  std::vector<double> raw_rtt;
  for (int i = 0; i < settings.rtt_iterations; ++i) {
    raw_rtt.push_back(1e6 * seconds_of([&] { raw.echo(buffer, 80); }));
  }
  out["rtt_us_p50"] = percentile(rtt, 0.5);
  out["rtt_us_p99"] = percentile(rtt, 0.99);
  out["rtt_inline_us_p50"] = percentile(rtt_inline, 0.5);
  out["rtt_inline_us_p99"] = percentile(rtt_inline, 0.99);
  out["raw_tcp_rtt_us_p50"] = percentile(raw_rtt, 0.5);
  out["raw_tcp_rtt_us_p99"] = percentile(raw_rtt, 0.99);
  out["rtt_ratio"] = percentile(rtt, 0.5) / percentile(raw_rtt, 0.5);
  std::cerr << fmt::format("rtt: rpc p50 {:.1f} us, inline {:.1f} us, raw tcp p50 {:.1f} us\n",
                           percentile(rtt, 0.5), percentile(rtt_inline, 0.5),
                           percentile(raw_rtt, 0.5));
}

void measure_echoes(const RpcBenchSettings& settings, const std::string& to, RawEchoClient& raw,
                    std::vector<char>& buffer, nlohmann::ordered_json& out) {
  // Echo of a large tensor: bytes moved in both directions per second, beside the same echo over
  // raw TCP and the raw one-way stream (what iperf3 reports). The three are interleaved within
  // each repeat, and the ratio is the median of the repeats' own ratios, so that the load of a
  // shared machine falls on both sides of it alike.
  nlohmann::ordered_json echo, raw_echo, raw_stream, ratios;
  for (int mib : settings.echo_mib) {
    std::uint64_t bytes = std::uint64_t(mib) << 20;
    at::Tensor t = torch::randn({static_cast<int64_t>(bytes / sizeof(float))});
    rpc::rpc_sync(to, "echo", {t});
    raw.echo(buffer, bytes);
    raw.stream(buffer, bytes);
    std::vector<double> rpc_rates, raw_rates, stream_rates, ratio;
    for (int r = 0; r < settings.echo_repeats; ++r) {
      rpc_rates.push_back(2.0 * bytes / 1e9 / seconds_of([&] { rpc::rpc_sync(to, "echo", {t}); }));
      raw_rates.push_back(2.0 * bytes / 1e9 / seconds_of([&] { raw.echo(buffer, bytes); }));
      stream_rates.push_back(1.0 * bytes / 1e9 / seconds_of([&] { raw.stream(buffer, bytes); }));
      ratio.push_back(rpc_rates.back() / raw_rates.back());
    }
    std::string key = std::to_string(mib) + "MiB";
    echo[key] = median(rpc_rates);
    raw_echo[key] = median(raw_rates);
    raw_stream[key] = median(stream_rates);
    ratios[key] = median(ratio);
    std::cerr << fmt::format(
        "echo {} MiB: rpc {:.2f} GB/s, raw tcp {:.2f} GB/s ({:.2f}x), raw one-way {:.2f} GB/s\n",
        mib, median(rpc_rates), median(raw_rates), median(ratio), median(stream_rates));
  }
  out["echo_gbps"] = echo;
  out["raw_tcp_echo_gbps"] = raw_echo;
  out["raw_tcp_stream_gbps"] = raw_stream;
  out["echo_ratio"] = ratios;
}

// Many small calls in flight.
void measure_async_calls(const RpcBenchSettings& settings, const std::string& to,
                         nlohmann::ordered_json& out) {
  std::vector<double> rates;
  for (int r = 0; r < std::max(1, settings.repeats / 2); ++r) {
    std::deque<rpc::FuturePtr> window;
    double s = seconds_of([&] {
      for (int i = 0; i < settings.async_calls; ++i) {
        if (static_cast<int>(window.size()) >= settings.async_window) {
          window.front()->wait();
          window.pop_front();
        }
        window.push_back(rpc::rpc_async(to, "echo", {int64_t{i}}));
      }
      for (auto& f : window) f->wait();
    });
    rates.push_back(settings.async_calls / s);
  }
  out["async_calls_per_s"] = median(rates);
  out["async_window"] = settings.async_window;
  std::cerr << fmt::format("async: {:.0f} calls/s with {} in flight\n", median(rates),
                           settings.async_window);
}

}  // namespace

int run_rpc_bench(const RpcBenchSettings& settings) {
  register_bench_functions();
  const core::PortFile port_file;
  pid_t peer = spawn_process(settings.self_path, {"rpc-peer"},
                             core::loopback_world_env(1, 2, 0, port_file.path()));
  init_loopback_master("bench", 2, port_file.path());
  const std::string to = "worker1";
  nlohmann::ordered_json out;
  out["benchmark"] = "rpc";
  RawEchoClient raw("127.0.0.1", static_cast<int>(rpc::rpc_sync(to, "raw_port").toInt()));
  std::vector<char> buffer(64);
  measure_round_trips(settings, to, raw, buffer, out);
  measure_echoes(settings, to, raw, buffer, out);
  measure_async_calls(settings, to, out);
  rpc::shutdown();
  reap_process(peer);
  out["threads"] = at::get_num_threads();
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace ferry::bench
