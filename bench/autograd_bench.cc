// Steps alternate between the split model (activations stage to stage, as the training job sends
// them, then through the master, as naive model parallelism does) and the local one so that all
// see the same noise of this shared machine. Each process gets the same intra-op threads: the
// stages of a naive split run one at a time, so each has the machine to itself while it runs, as
// the local model does.
#include "bench/autograd_bench.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/processes.h"
#include "bench/stats.h"
#include "ferry/core/local_world.h"
#include "ferry/core/process_memory.h"
#include "ferry/core/processes.h"
#include "ferry/dist_autograd/context.h"
#include "ferry/dist_autograd/optimizer.h"
#include "ferry/models/compare.h"
#include "ferry/models/remote_unet.h"
#include "ferry/rpc/options.h"
#include "ferry/rpc/rpc.h"

namespace ferry::bench {
namespace {

constexpr double kLr = 0.01;
constexpr double kMomentum = 0.9;

at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& target) {
  return torch::binary_cross_entropy_with_logits(logits, target);
}

// The largest relative difference between the split's and one process's gradients of the same
// weights on the same batch, before any step changes them.
double gradient_error(models::RemoteUnet& split, models::Unet& local, const at::Tensor& x,
                      const at::Tensor& target) {
  dist_autograd::Context context;
  dist_autograd::backward(context, {loss_of(split.forward(x), target)});
  std::vector<at::Tensor> dist = dist_autograd::get_gradients(context.id(), split.parameters());
  loss_of(local->forward(x), target).backward();
  std::vector<at::Tensor> want;
  for (const auto& p : local->parameters()) want.push_back(p.grad());
  return models::max_relative_error(dist, want);
}

// Autograd contexts still held here and on the three workers: none, once every step released
// its own.
int64_t contexts_left() {
  int64_t left = static_cast<int64_t>(dist_autograd::context_count());
  for (int rank = 1; rank <= 3; ++rank) {
    left += dist_autograd::context_count(fmt::format("worker{}", rank));
  }
  return left;
}

nlohmann::ordered_json header(const AutogradBenchSettings& settings, int threads) {
  nlohmann::ordered_json out;
  out["benchmark"] = "autograd";
  out["model"] = fmt::format("unet-resnet{}", settings.depth);
  out["batch"] = settings.batch;
  out["image_size"] = settings.image_size;
  out["threads_per_process"] = threads;
  out["steps"] = settings.steps;
  return out;
}

// Each stage's own compute, from its worker's clocks: forward of the stage, backward of the
// worker's parts. Read between steps, outside the timed part.
std::vector<double> worker_clocks(const models::RemoteUnet& split) {
  std::vector<double> clocks;
  for (const auto& stage : split.stages()) {
    clocks.push_back(stage.module.stats().forward_s);
    clocks.push_back(dist_autograd::backward_seconds(stage.module.worker()));
  }
  return clocks;
}

// What each stage computed between two readings of worker_clocks, into `parts`.
void add_stage_parts(const models::RemoteUnet& split, const std::vector<double>& before,
                     const std::vector<double>& after,
                     std::map<std::string, std::vector<double>>& parts) {
  for (size_t k = 0; k < split.stages().size(); ++k) {
    const std::string& name = split.stages()[k].name();
    parts["stage_" + name + "_forward_s"].push_back(after[2 * k] - before[2 * k]);
    parts["stage_" + name + "_backward_s"].push_back(after[2 * k + 1] - before[2 * k + 1]);
  }
}

// The measurement itself, with the world up; stages and optimizer are gone when it returns.
nlohmann::ordered_json measure(const AutogradBenchSettings& settings, int threads) {
  models::RemoteUnet split =
      models::RemoteUnet::create(settings.depth, 1, {"worker1", "worker2", "worker3"});
  models::Unet local = split.local_copy();

  torch::manual_seed(0);
  at::Tensor x = torch::randn({settings.batch, 3, settings.image_size, settings.image_size});
  at::Tensor target =
      (torch::rand({settings.batch, 1, settings.image_size, settings.image_size}) > 0.5)
          .to(torch::kFloat);

  const double grad_error = gradient_error(split, local, x, target);

  dist_autograd::DistributedOptimizer optimizer(dist_autograd::OptimizerSpec::sgd(kLr, kMomentum),
                                                split.parameters());
  torch::optim::SGD local_optimizer(local->parameters(),
                                    torch::optim::SGDOptions(kLr).momentum(kMomentum));
  std::vector<double> dist_steps, via_master_steps, local_steps;
  std::map<std::string, std::vector<double>> parts;
  // One distributed step: activations through this process, or `direct` from worker to worker.
  auto dist_step = [&](bool direct, double& f, double& b, double& o) {
    return seconds_of([&] {
      dist_autograd::Context context;
      at::Tensor loss;
      f = seconds_of([&] { loss = loss_of(split.forward(x, direct), target); });
      b = seconds_of([&] { dist_autograd::backward(context.id(), {loss}); });
      o = seconds_of([&] { optimizer.step(context.id()); });
    });
  };
  for (int step = 0; step < settings.warmup + settings.steps; ++step) {
    bool timed = step >= settings.warmup;
    std::vector<double> clocks_before = worker_clocks(split);
    double f = 0, b = 0, o = 0;
    double dist = dist_step(true, f, b, o);
    std::vector<double> clocks_after = worker_clocks(split);
    double mf = 0, mb = 0, mo = 0;
    double via_master = dist_step(false, mf, mb, mo);
    double lf = 0, lb = 0, lo = 0;
    double one = seconds_of([&] {
      local_optimizer.zero_grad();
      at::Tensor loss;
      lf = seconds_of([&] { loss = loss_of(local->forward(x), target); });
      lb = seconds_of([&] { loss.backward(); });
      lo = seconds_of([&] { local_optimizer.step(); });
    });
    if (!timed) continue;
    add_stage_parts(split, clocks_before, clocks_after, parts);
    dist_steps.push_back(dist);
    via_master_steps.push_back(via_master);
    local_steps.push_back(one);
    for (auto [name, value] : {std::pair{"dist_forward_s", f},
                               {"dist_backward_s", b},
                               {"dist_optimizer_s", o},
                               {"via_master_forward_s", mf},
                               {"via_master_backward_s", mb},
                               {"via_master_optimizer_s", mo},
                               {"local_forward_s", lf},
                               {"local_backward_s", lb},
                               {"local_optimizer_s", lo}}) {
      parts[name].push_back(value);
    }
    std::cerr << fmt::format(
        "step {}: stage to stage {:.3f} s ({:.3f}, {:.3f}, {:.3f}), through the master {:.3f} s "
        "({:.3f}, {:.3f}, {:.3f}), one process {:.3f} s ({:.3f}, {:.3f}, {:.3f})\n",
        step - settings.warmup, dist, f, b, o, via_master, mf, mb, mo, one, lf, lb, lo);
  }

  nlohmann::ordered_json out = header(settings, threads);
  out["max_rel_grad_err"] = grad_error;
  out["dist_step_s"] = median(dist_steps);
  out["local_step_s"] = median(local_steps);
  out["ratio"] = median(dist_steps) / median(local_steps);
  out["via_master_step_s"] = median(via_master_steps);
  out["via_master_ratio"] = median(via_master_steps) / median(local_steps);
  for (const auto& [name, values] : parts) out[name] = median(values);
  out["contexts_left"] = contexts_left();
  return out;
}

}  // namespace

int run_autograd_bench(const AutogradBenchSettings& settings) {
  int threads = settings.threads > 0 ? settings.threads
                                     : static_cast<int>(std::thread::hardware_concurrency());
  at::set_num_threads(threads);
  dist_autograd::install(rpc::default_registry());
  models::register_unet_stages();

  const core::PortFile port_file;
  std::vector<pid_t> workers;
  std::string worker_binary = core::executable_dir() + "/ferry-worker";
  for (int rank = 1; rank <= 3; ++rank) {
    auto env = core::loopback_world_env(rank, 4, 0, port_file.path());
    env["OMP_NUM_THREADS"] = std::to_string(threads);
    env["FERRY_LOG_LEVEL"] = "warn";
    workers.push_back(spawn_process(worker_binary, {"--name", fmt::format("worker{}", rank)}, env));
  }
  init_loopback_master("master", 4, port_file.path());

  nlohmann::ordered_json out = measure(settings, threads);
  nlohmann::ordered_json rss;
  rss["master"] = core::peak_rss_mib();
  for (int rank = 1; rank <= 3; ++rank) {
    rss[fmt::format("worker{}", rank)] = core::peak_rss_mib(workers[rank - 1]);
  }
  out["peak_rss_mib"] = rss;
  rpc::shutdown();
  for (pid_t pid : workers) reap_process(pid);
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace ferry::bench
