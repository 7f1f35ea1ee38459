#include "ferry/models/block_costs.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>

#include "ferry/core/neighbours.h"
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

// Blocks [first, last) of one pass over the chain, one at a time, from `carry` (what block
// `first` takes). With `memory`, each block's parameters and bytes go there, at its index in the
// chain. Ends early, between blocks, once `stop` is set. The times are of the blocks run, from
// `first` on.
PassTimes run_blocks(const BlockChain& chain, int64_t first, int64_t last,
                     std::vector<at::Tensor> carry, int64_t samples, std::vector<BlockCost>* memory,
                     const std::atomic<bool>* stop = nullptr) {
  const double n = static_cast<double>(samples);
  PassTimes times;
  for (int64_t k = first; k < last; ++k) {
    if (stop != nullptr && *stop) break;
    // The first block's input is the data, whose gradient no stage computes.
    std::vector<at::Tensor> inputs = k == 0 ? carry : detached_leaves(carry);
    const std::int64_t before = core::tensor_memory().live_bytes;
    auto start = Clock::now();
    std::vector<at::Tensor> outputs = chain.forward(k, inputs);
    times.forward_s.push_back(seconds_since(start));
    const at::Tensor& made = outputs.back();
    const double live = static_cast<double>(core::tensor_memory().live_bytes - before);
    const std::int64_t held = core::tensor_memory().live_bytes;
    if (memory != nullptr) core::reset_tensor_memory_peak();
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
    cost.backward_extra_bytes_per_sample =
        static_cast<double>(std::max<std::int64_t>(core::tensor_memory().peak_bytes - held, 0)) / n;
    for (const at::Tensor& t : outputs) {
      cost.carry_bytes_per_sample += static_cast<double>(t.nbytes()) / n;
    }
  }
  return times;
}

// One pass over every block of the chain.
PassTimes run_pass(const BlockChain& chain, int64_t samples, std::vector<BlockCost>* memory,
                   const std::atomic<bool>* stop = nullptr) {
  return run_blocks(chain, 0, static_cast<int64_t>(chain.names.size()), chain.input(samples),
                    samples, memory, stop);
}

// What block `first` takes in a pass over `samples` samples: the blocks before it run forward,
// without autograd.
std::vector<at::Tensor> carry_at(const BlockChain& chain, int64_t first, int64_t samples) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> carry = chain.input(samples);
  for (int64_t k = 0; k < first; ++k) carry = chain.forward(k, std::move(carry));
  return carry;
}

// Blocks [first, last) of a chain.
struct Stretch {
  int64_t first, last;
};

// The stages of a chain of `count` blocks cut before each block of `cut`.
std::vector<Stretch> stretches_of(const std::vector<int64_t>& cut, int64_t count) {
  std::vector<Stretch> out;
  int64_t first = 0;
  for (int64_t at : cut) {
    if (at <= first || at >= count) {
      throw std::invalid_argument(fmt::format(
          "blocks are timed beside the stages of a cut before blocks {}, which does not cut a "
          "chain of {} blocks into stages in order",
          fmt::join(cut, ", "), count));
    }
    out.push_back({first, at});
    first = at;
  }
  out.push_back({first, count});
  return out;
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

// Each block's median forward and backward over `passes` (each over the same blocks).
PassTimes medians_of(const std::vector<PassTimes>& passes) {
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

// Each block's median over `timed_passes` passes while `neighbours` run beside it what the stages
// beside its own will run: the other stages of `cut`, one each in turn; without a cut, the whole
// chain.
PassTimes times_beside(const BlockChain& chain, int64_t samples, int timed_passes,
                       const std::vector<BlockChain>& neighbours, const std::vector<int64_t>& cut) {
  const auto count = static_cast<int64_t>(chain.names.size());
  const std::vector<Stretch> stages =
      cut.empty() ? std::vector<Stretch>{{0, count}} : stretches_of(cut, count);
  PassTimes out;
  for (const Stretch& stage : stages) {
    std::vector<Stretch> others;
    for (const Stretch& other : stages) {
      if (other.first != stage.first) others.push_back(other);
    }
    if (others.empty()) others.push_back(stage);
    std::vector<std::vector<at::Tensor>> carries;
    for (size_t i = 0; i < neighbours.size(); ++i) {
      carries.push_back(carry_at(neighbours[i], others[i % others.size()].first, samples));
    }
    const std::vector<at::Tensor> carry = carry_at(chain, stage.first, samples);
    core::Neighbours beside(
        static_cast<int>(neighbours.size()), [&](int i, const std::atomic<bool>& stop) {
          const Stretch& other = others[i % others.size()];
          run_blocks(neighbours[i], other.first, other.last, carries[i], samples, nullptr, &stop);
        });
    std::vector<PassTimes> passes;
    while (static_cast<int>(passes.size()) < timed_passes) {
      passes.push_back(run_blocks(chain, stage.first, stage.last, carry, samples, nullptr));
    }
    beside.stop();
    const PassTimes times = medians_of(passes);
    out.forward_s.insert(out.forward_s.end(), times.forward_s.begin(), times.forward_s.end());
    out.backward_s.insert(out.backward_s.end(), times.backward_s.begin(), times.backward_s.end());
  }
  return out;
}

// Each block's median forward and backward at `samples` over `timed_passes` passes, after an
// untimed pass, with `neighbours` beside it (times_beside). With `memory`, a pass counts each
// block's bytes, alone (the neighbours' tensors would blur them); its times count only when
// there are no neighbours.
PassTimes median_times(const BlockChain& chain, int64_t samples, int timed_passes,
                       const std::vector<BlockChain>& neighbours, const std::vector<int64_t>& cut,
                       std::vector<BlockCost>* memory) {
  run_pass(chain, samples, nullptr);
  if (neighbours.empty()) {
    std::vector<PassTimes> passes;
    if (memory != nullptr) passes.push_back(run_pass(chain, samples, memory));
    while (static_cast<int>(passes.size()) < timed_passes) {
      passes.push_back(run_pass(chain, samples, nullptr));
    }
    return medians_of(passes);
  }
  if (memory != nullptr) run_pass(chain, samples, memory);
  return times_beside(chain, samples, timed_passes, neighbours, cut);
}

// The blocks of a U-Net-ResNet-`depth` in training mode, on random images of `image_size`; its
// copies are new networks.
BlockChain unet_chain(int64_t depth, int64_t classes, core::ImageSize image_size, int64_t seed) {
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
    return std::vector<at::Tensor>{torch::randn({samples, 3, image_size.height, image_size.width})};
  };
  chain.copy = [=] { return unet_chain(depth, classes, image_size, seed + 1); };
  return chain;
}

// A backward's extra bytes per sample from its bytes per sample at two sizes: the slope between
// them, leaving out what does not grow with the samples (the temporaries of the parameters'
// gradients, which a stage's memory counts once as the gradients themselves).
double extra_per_sample(int64_t small, double small_per_sample, int64_t large,
                        double large_per_sample) {
  if (small == large) return small_per_sample;
  const double n1 = static_cast<double>(small), n2 = static_cast<double>(large);
  return std::max(0.0, (n1 * small_per_sample - n2 * large_per_sample) / (n1 - n2));
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
  if (!sampling.cut.empty()) stretches_of(sampling.cut, static_cast<int64_t>(chain.names.size()));
  core::count_tensor_memory();
  ThreadsScope threads(sampling.threads);
  const int timed = std::max(sampling.timed_passes, 1);
  std::vector<BlockCost> costs(chain.names.size());
  for (size_t k = 0; k < costs.size(); ++k) costs[k].name = chain.names[k];
  std::vector<BlockChain> neighbours;
  for (int i = 0; i < sampling.neighbours; ++i) neighbours.push_back(chain.copy());
  const PassTimes at_run =
      median_times(chain, sampling.samples, timed, neighbours, sampling.cut, &costs);
  std::vector<BlockCost> at_second_memory(costs.size());
  const PassTimes at_second =
      median_times(chain, second, timed, neighbours, sampling.cut, &at_second_memory);
  for (size_t k = 0; k < costs.size(); ++k) {
    costs[k].backward_extra_bytes_per_sample =
        extra_per_sample(sampling.samples, costs[k].backward_extra_bytes_per_sample, second,
                         at_second_memory[k].backward_extra_bytes_per_sample);
    costs[k].forward =
        fit_pass_cost(sampling.samples, at_run.forward_s[k], second, at_second.forward_s[k]);
    costs[k].backward =
        fit_pass_cost(sampling.samples, at_run.backward_s[k], second, at_second.backward_s[k]);
  }
  return costs;
}

std::vector<BlockCost> measure_unet_blocks(int64_t depth, int64_t classes,
                                           const core::ImageSize& image_size,
                                           const CostSampling& sampling, int64_t seed) {
  for (const int64_t side : {image_size.height, image_size.width}) {
    if (side < 32 || side % 32 != 0) {
      throw std::invalid_argument(
          fmt::format("image size {} is not a multiple of 32 (the U-Net's encoder "
                      "halves it five times)",
                      image_size.text()));
    }
  }
  return measure_blocks(unet_chain(depth, classes, image_size, seed), sampling);
}

}  // namespace ferry::models
