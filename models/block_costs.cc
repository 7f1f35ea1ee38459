#include "ferry/models/block_costs.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "ferry/core/process_memory.h"
#include "ferry/models/unet_blocks.h"

namespace ferry::models {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<at::Tensor> detached_leaves(const std::vector<at::Tensor>& carry) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : carry) out.push_back(t.detach().requires_grad_(true));
  return out;
}

// Each block's forward and backward seconds over one pass.
struct PassTimes {
  std::vector<double> forward_s, backward_s;
};

// One pass over the chain, block by block. With `memory`, each block's parameters and bytes go
// there. Ends early, between blocks, once `stop` is set.
PassTimes run_pass(const BlockChain& chain, int64_t samples, std::vector<BlockCost>* memory,
                   const std::atomic<bool>* stop = nullptr) {
  const auto count = static_cast<int64_t>(chain.names.size());
  const double n = static_cast<double>(samples);
  PassTimes times;
  std::vector<at::Tensor> carry = chain.input(samples);
  for (int64_t k = 0; k < count; ++k) {
    if (stop != nullptr && *stop) break;
    // The first block's input is the data, whose gradient no stage computes.
    std::vector<at::Tensor> inputs = k == 0 ? carry : detached_leaves(carry);
    const std::int64_t before = core::tensor_memory().live_bytes;
    auto start = Clock::now();
    std::vector<at::Tensor> outputs = chain.forward(k, inputs);
    times.forward_s.push_back(seconds_since(start));
    const at::Tensor& made = outputs.back();
    const double live = static_cast<double>(core::tensor_memory().live_bytes - before);
    start = Clock::now();
    made.backward(torch::ones_like(made));
    times.backward_s.push_back(seconds_since(start));
    carry.clear();
    for (const at::Tensor& t : outputs) carry.push_back(t.detach());
    if (memory == nullptr) continue;
    BlockCost& cost = (*memory)[k];
    for (const at::Tensor& p : chain.parameters(k)) {
      cost.parameters += p.numel();
      cost.parameter_bytes += static_cast<int64_t>(p.nbytes());
      cost.largest_parameter_bytes =
          std::max(cost.largest_parameter_bytes, static_cast<int64_t>(p.nbytes()));
    }
    cost.output_bytes_per_sample = static_cast<double>(made.nbytes()) / n;
    cost.activation_bytes_per_sample = std::max(live / n, cost.output_bytes_per_sample);
    for (const at::Tensor& t : outputs) {
      cost.carry_bytes_per_sample += static_cast<double>(t.nbytes()) / n;
    }
  }
  return times;
}

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

// Sets this thread's intra-op threads for its lifetime; 0 leaves them.
class ThreadsScope {
 public:
  explicit ThreadsScope(int threads) : previous_(at::get_num_threads()) {
    if (threads > 0) at::set_num_threads(threads);
  }
  ~ThreadsScope() { at::set_num_threads(previous_); }
  ThreadsScope(const ThreadsScope&) = delete;
  ThreadsScope& operator=(const ThreadsScope&) = delete;

 private:
  int previous_;
};

// The stages beside the one being timed: one thread per copy of the chain, each running passes of
// its copy at one size, one intra-op thread each, until stopped. stop() rethrows what a
// neighbour failed with.
class Neighbours {
 public:
  Neighbours(const std::vector<BlockChain>& copies, int64_t samples) {
    try {
      for (const BlockChain& copy : copies) {
        threads_.emplace_back([this, &copy, samples] { run(copy, samples); });
      }
    } catch (...) {
      join();
      throw;
    }
  }
  ~Neighbours() { join(); }
  Neighbours(const Neighbours&) = delete;
  Neighbours& operator=(const Neighbours&) = delete;

  void stop() {
    join();
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  void run(const BlockChain& copy, int64_t samples) {
    ThreadsScope one(1);
    try {
      while (!stop_) run_pass(copy, samples, nullptr, &stop_);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_) failure_ = std::current_exception();
    }
  }

  void join() {
    stop_ = true;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::exception_ptr failure_;
  std::vector<std::thread> threads_;
};

// Each block's median forward and backward at `samples` over `timed_passes` passes, with
// `neighbours` running beside them, after an untimed pass. With `memory`, a pass counts each
// block's bytes, alone (the neighbours' tensors would blur them); its times count only when
// there are no neighbours.
PassTimes median_times(const BlockChain& chain, int64_t samples, int timed_passes,
                       const std::vector<BlockChain>& neighbours, std::vector<BlockCost>* memory) {
  run_pass(chain, samples, nullptr);
  std::vector<PassTimes> passes;
  if (memory != nullptr) {
    PassTimes counted = run_pass(chain, samples, memory);
    if (neighbours.empty()) passes.push_back(std::move(counted));
  }
  Neighbours beside(neighbours, samples);
  while (static_cast<int>(passes.size()) < timed_passes) {
    passes.push_back(run_pass(chain, samples, nullptr));
  }
  beside.stop();
  PassTimes out;
  for (size_t k = 0; k < passes.front().forward_s.size(); ++k) {
    std::vector<double> forward, backward;
    for (const PassTimes& p : passes) {
      forward.push_back(p.forward_s[k]);
      backward.push_back(p.backward_s[k]);
    }
    out.forward_s.push_back(median_of(std::move(forward)));
    out.backward_s.push_back(median_of(std::move(backward)));
  }
  return out;
}

// The blocks of a U-Net-ResNet-`depth` in training mode, on random images of `image_size`; its
// copies are new networks.
BlockChain unet_chain(int64_t depth, int64_t classes, int64_t image_size, int64_t seed) {
  const auto count = static_cast<int64_t>(unet_blocks(depth).size());
  UnetBlocks net(depth, classes, 0, count, seed);
  net->train(true);
  BlockChain chain;
  for (const UnetBlock& block : net->blocks()) chain.names.push_back(block.name);
  chain.forward = [net](int64_t k, std::vector<at::Tensor> carry) mutable {
    return net->forward_block(k, std::move(carry));
  };
  chain.parameters = [net](int64_t k) mutable { return net->block_parameters(k); };
  chain.input = [image_size](int64_t samples) {
    return std::vector<at::Tensor>{torch::randn({samples, 3, image_size, image_size})};
  };
  chain.copy = [=] { return unet_chain(depth, classes, image_size, seed + 1); };
  return chain;
}

}  // namespace

PassCost fit_pass_cost(int64_t small, double small_s, int64_t large, double large_s) {
  const double n1 = static_cast<double>(small), n2 = static_cast<double>(large);
  if (small != large) {
    const double per_sample = (large_s - small_s) / (n2 - n1);
    const double fixed = small_s - per_sample * n1;
    if (per_sample < 0) return {(small_s + large_s) / 2, 0};
    if (fixed >= 0) return {fixed, per_sample};
  }
  return {0, (n1 * small_s + n2 * large_s) / (n1 * n1 + n2 * n2)};
}

std::vector<BlockCost> measure_blocks(const BlockChain& chain, const CostSampling& sampling) {
  const int64_t second = sampling.second_size();
  if (sampling.samples < 1 || second < 1) {
    throw std::invalid_argument(fmt::format("blocks are timed on at least one sample, not {}",
                                            std::min(sampling.samples, second)));
  }
  if (sampling.neighbours > 0 && (sampling.threads != 1 || !chain.copy)) {
    throw std::invalid_argument(
        "blocks timed beside neighbouring stages need one thread each and a copy of the chain");
  }
  core::count_tensor_memory();
  ThreadsScope threads(sampling.threads);
  const int timed = std::max(sampling.timed_passes, 1);
  std::vector<BlockCost> costs(chain.names.size());
  for (size_t k = 0; k < costs.size(); ++k) costs[k].name = chain.names[k];
  std::vector<BlockChain> neighbours;
  for (int i = 0; i < sampling.neighbours; ++i) neighbours.push_back(chain.copy());
  const PassTimes at_run = median_times(chain, sampling.samples, timed, neighbours, &costs);
  const PassTimes at_second = median_times(chain, second, timed, neighbours, nullptr);
  for (size_t k = 0; k < costs.size(); ++k) {
    costs[k].forward =
        fit_pass_cost(sampling.samples, at_run.forward_s[k], second, at_second.forward_s[k]);
    costs[k].backward =
        fit_pass_cost(sampling.samples, at_run.backward_s[k], second, at_second.backward_s[k]);
  }
  return costs;
}

std::vector<BlockCost> measure_unet_blocks(int64_t depth, int64_t classes, int64_t image_size,
                                           const CostSampling& sampling, int64_t seed) {
  if (image_size < 32 || image_size % 32 != 0) {
    throw std::invalid_argument(
        fmt::format("image size {} is not a multiple of 32 (the U-Net's encoder "
                    "halves it five times)",
                    image_size));
  }
  return measure_blocks(unet_chain(depth, classes, image_size, seed), sampling);
}

}  // namespace ferry::models
