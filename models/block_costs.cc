#include "ferry/models/block_costs.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

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

}  // namespace

std::vector<BlockCost> measure_unet_blocks(int64_t depth, int64_t classes, int64_t image_size,
                                           int64_t sample_batch, int64_t seed, int timed_passes) {
  if (image_size < 32 || image_size % 32 != 0) {
    throw std::invalid_argument(
        fmt::format("image size {} is not a multiple of 32 (the U-Net's encoder "
                    "halves it five times)",
                    image_size));
  }
  core::count_tensor_memory();
  const auto count = static_cast<int64_t>(unet_blocks(depth).size());
  UnetBlocks net(depth, classes, 0, count, seed);
  net->train(true);
  const double samples = static_cast<double>(sample_batch);
  at::Tensor images = torch::randn({sample_batch, 3, image_size, image_size});
  // The first pass pays for fresh pages and every kernel's first call: it is not timed. Of the
  // timed passes, each block keeps its fastest, which the machine's other work disturbs least.
  const int passes = 1 + std::max(timed_passes, 1);
  std::vector<BlockCost> costs(count);
  for (int pass = 0; pass < passes; ++pass) {
    std::vector<at::Tensor> carry{images};
    for (int64_t k = 0; k < count; ++k) {
      BlockCost measured;
      measured.name = net->blocks()[k].name;
      for (const at::Tensor& p : net->block_parameters(k)) {
        measured.parameters += p.numel();
        measured.parameter_bytes += static_cast<int64_t>(p.nbytes());
        measured.largest_parameter_bytes =
            std::max(measured.largest_parameter_bytes, static_cast<int64_t>(p.nbytes()));
      }
      std::vector<at::Tensor> inputs = detached_leaves(carry);
      const std::int64_t before = core::tensor_memory().live_bytes;
      auto start = Clock::now();
      std::vector<at::Tensor> outputs = net->forward_block(k, inputs);
      measured.forward_s_per_sample = seconds_since(start) / samples;
      const at::Tensor& made = outputs.back();
      measured.output_bytes_per_sample = static_cast<double>(made.nbytes()) / samples;
      measured.activation_bytes_per_sample =
          std::max(static_cast<double>(core::tensor_memory().live_bytes - before) / samples,
                   measured.output_bytes_per_sample);
      start = Clock::now();
      made.backward(torch::ones_like(made));
      measured.backward_s_per_sample = seconds_since(start) / samples;
      carry.clear();
      for (const at::Tensor& t : outputs) {
        measured.carry_bytes_per_sample += static_cast<double>(t.nbytes()) / samples;
        carry.push_back(t.detach());
      }
      BlockCost& cost = costs[k];
      if (pass == 1) {
        cost = measured;
      } else if (pass > 1) {
        cost.forward_s_per_sample =
            std::min(cost.forward_s_per_sample, measured.forward_s_per_sample);
        cost.backward_s_per_sample =
            std::min(cost.backward_s_per_sample, measured.backward_s_per_sample);
      }
    }
  }
  return costs;
}

}  // namespace ferry::models
