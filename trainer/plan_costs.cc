#include "trainer/plan_costs.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>
#include <thread>
#include <vector>

#include "ferry/models/unet.h"
#include "ferry/models/unet_blocks.h"

namespace ferry::trainer {
namespace {

using Clock = std::chrono::steady_clock;

// The fastest of `runs` calls of `f`, in seconds.
template <typename F>
double fastest(int runs, F&& f) {
  double best = 1e30;
  for (int k = 0; k < runs; ++k) {
    const auto start = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

// The first blocks of the model (the stem and layer1, the widest activations) forward and
// backward on `samples` images with `threads` intra-op threads: how a worker's speed grows with
// its threads on this model, bandwidth-bound layers included.
double first_blocks_s(const PlanRequest& r, int64_t samples, int threads) {
  const int previous = at::get_num_threads();
  at::set_num_threads(threads);
  const int64_t depth = depth_of(r.model);
  const auto blocks = static_cast<int64_t>(models::unet_blocks(depth).size());
  models::UnetBlocks part(depth, r.classes, 0, std::min<int64_t>(4, blocks));
  at::Tensor image = torch::randn({samples, 3, r.image_size.height, r.image_size.width});
  const double s = fastest(2, [&] { part->forward({image}).back().sum().backward(); });
  at::set_num_threads(previous);
  return s;
}

// Bytes per second through a loopback socket pair, one thread writing and one reading: the
// carries' and the all-reduce's path between two workers of this machine.
double link_bytes_per_s() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 1e9;
  constexpr size_t kChunk = 1 << 20, kTotal = 64 << 20;
  std::vector<char> out(kChunk, 1), in(kChunk);
  const auto start = Clock::now();
  std::thread reader([&] {
    size_t got = 0;
    while (got < kTotal) {
      const ssize_t n = read(fds[1], in.data(), in.size());
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
  });
  for (size_t sent = 0; sent < kTotal;) {
    const ssize_t n = write(fds[0], out.data() + sent % kChunk, kChunk - sent % kChunk);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  reader.join();
  close(fds[0]);
  close(fds[1]);
  return static_cast<double>(kTotal) / std::chrono::duration<double>(Clock::now() - start).count();
}

// An optimizer step per parameter, on one thread (Adam's: the dearest of those Ferry offers).
double optimizer_s_per_parameter() {
  const int previous = at::get_num_threads();
  at::set_num_threads(1);
  constexpr int64_t kParameters = 1 << 22;
  at::Tensor p = torch::zeros({kParameters}, torch::requires_grad());
  p.mutable_grad() = torch::randn({kParameters});
  torch::optim::Adam adam({p});
  const double s = fastest(3, [&] { adam.step(); });
  at::set_num_threads(previous);
  return s / kParameters;
}

MachineCosts measure_machine(const PlanRequest& r, int64_t samples, int cores,
                             int cores_per_worker) {
  MachineCosts m;
  m.cores = cores;
  m.cores_per_worker = cores_per_worker;
  m.thread_speedup = cores_per_worker > 1 ? first_blocks_s(r, samples, 1) /
                                                first_blocks_s(r, samples, cores_per_worker)
                                          : 1;
  m.link_bytes_per_s = link_bytes_per_s();
  m.optimizer_s_per_parameter = optimizer_s_per_parameter();
  return m;
}

}  // namespace

int cores_of(int cores) {
  return cores > 0 ? cores : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// The blocks are timed on one thread (the planner scales them to a worker's cores) at the batch
// (at most 16 images) and a quarter of it: a fixed part and a part per image for every
// micro-batch size the search tries.
CostKey key_of(const PlanRequest& r, int cores, int cores_per_worker) {
  const int64_t large = std::clamp<int64_t>(r.largest_batch ? 8 : r.batch_size, 2, 16);
  return {r.model,
          r.classes,
          r.image_size,
          large,
          std::max<int64_t>(1, large / 4),
          1,
          fmt::format("{} (planned for {} cores, at most {} per worker)", this_machine(), cores,
                      cores_per_worker),
          ferry_version()};
}

nlohmann::ordered_json costs_source(const std::string& cache_dir, int cores, int cores_per_worker) {
  return {{"cache_dir", cache_dir.empty() ? default_cache_dir() : cache_dir},
          {"cores", cores},
          {"cores_per_worker", cores_per_worker}};
}

CachedCosts costs_for(const PlanRequest& request, const std::string& cache_dir, int cores,
                      int cores_per_worker) {
  const std::string dir = cache_dir.empty() ? default_cache_dir() : cache_dir;
  const CostKey key = key_of(request, cores, cores_per_worker);
  if (std::optional<CachedCosts> cached = load_costs(dir, key)) {
    std::cerr << fmt::format("block costs of {} at {}: from {}\n", request.model,
                             request.image_size.extent(), cost_file(dir, key));
    return *cached;
  }
  const auto start = Clock::now();
  models::CostSampling sampling;
  sampling.samples = key.samples;
  sampling.second_samples = key.second_samples;
  sampling.threads = key.threads;
  sampling.timed_passes = 1;
  CachedCosts costs;
  costs.blocks = models::measure_unet_blocks(depth_of(request.model), request.classes,
                                             request.image_size, sampling);
  costs.machine = measure_machine(request, key.second_samples, cores, cores_per_worker);
  save_costs(dir, key, costs);
  std::cerr << fmt::format("block costs of {} at {}: measured in {:.0f} s, cached in {}\n",
                           request.model, request.image_size.extent(),
                           std::chrono::duration<double>(Clock::now() - start).count(),
                           cost_file(dir, key));
  return costs;
}

}  // namespace ferry::trainer
