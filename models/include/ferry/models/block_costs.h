// What each block of a model costs to train, measured in this process: the figures that
// `--stages N --balance memory|time|parameters` balances, that the stage table shows and that a
// run's measured stage compute is held against.
//
// A block's time is measured at two numbers of samples (the run's micro-batch and a second) and
// kept as a fixed part plus a part per sample: a deep block of few pixels and many channels is
// bound by its weights (mostly fixed), an early one by its activations (mostly per sample), so a
// time per sample taken at one size mispredicts the other.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ferry/core/image_size.h"

namespace ferry::models {

// Seconds of one pass (a forward or a backward) over `samples` samples. Value type.
struct PassCost {
  double fixed_s = 0;
  double per_sample_s = 0;
  double at(double samples) const { return fixed_s + per_sample_s * samples; }
};

// The line through two timings of a pass, at `small` and `large` samples (in either order). Noise
// can tilt a line through two points below zero: a negative per-sample part becomes a fixed cost
// (their mean), and a negative fixed part a cost per sample alone (the least-squares line through
// the origin). The same sizes give that line through the origin too.
PassCost fit_pass_cost(int64_t small, double small_s, int64_t large, double large_s);

// One block's measured costs. Value type.
struct BlockCost {
  std::string name;
  int64_t parameters = 0;
  int64_t parameter_bytes = 0;
  // Tensor bytes its forward leaves allocated until its backward (what autograd saved, and its
  // output), per sample, as the allocator counts them.
  double activation_bytes_per_sample = 0;
  // What its backward allocates at its peak beyond what the forward left (the gradient of its
  // output and of its inner tensors, and the kernels' workspace), per sample: the part that grows
  // with the samples, from its peaks at both sizes. A stage's backward holds it on top of the
  // activations of the blocks before this one.
  double backward_extra_bytes_per_sample = 0;
  double output_bytes_per_sample = 0;  // the tensor it makes
  double carry_bytes_per_sample = 0;   // everything it passes on: its output and the skips
  int64_t largest_parameter_bytes = 0;
  PassCost forward, backward;
  // Forward and backward of `samples` samples.
  double train_s(double samples) const { return forward.at(samples) + backward.at(samples); }
};

// How blocks are timed. Value type.
struct CostSampling {
  int64_t samples = 2;         // the run's micro-batch; memory is measured at this size
  int64_t second_samples = 0;  // 0: half of `samples` (2 when `samples` is 1)
  int threads = 0;             // the intra-op threads a stage will have; 0: this process's
  // Passes timed at each size after one that is not (it pays for fresh pages and each kernel's
  // first call on the size's shapes). Each block keeps its median pass: a run's stage compute is
  // what its passes take while the machine does its other work too, which the fastest pass leaves
  // out, and one disturbed pass does not move the median of three.
  int timed_passes = 3;
  // Stages that compute beside this one on the same machine while the run trains, each on its own
  // core. While blocks are timed, as many threads run passes of a copy of the chain (one thread
  // each, so `threads` must be 1), so that each block's time carries the memory and cache traffic
  // of the stages beside it, as the run's will.
  int neighbours = 0;
  // Where the run will cut the chain, when known: the first block of each stage but the first.
  // Each stage's blocks are then timed while the neighbours run the other stages' blocks (one
  // stage each, in turn), as they will in the run. A neighbour running the whole chain slows the
  // deepest, weight-bound blocks more than the stages beside them in the run do.
  std::vector<int64_t> cut;

  int64_t second_size() const {
    if (second_samples > 0) return second_samples;
    return samples == 1 ? 2 : samples / 2;
  }
};

// A model as a chain of blocks: each block takes the carry the one before gave (the first, the
// input) and gives the next one's; its backward starts from the last tensor it gives.
struct BlockChain {
  std::vector<std::string> names;
  std::function<std::vector<at::Tensor>(int64_t block, std::vector<at::Tensor> carry)> forward;
  std::function<std::vector<at::Tensor>(int64_t block)> parameters;
  std::function<std::vector<at::Tensor>(int64_t samples)> input;
  // Another chain of the same blocks, for a neighbour's passes (CostSampling::neighbours).
  std::function<BlockChain()> copy;
};

// Runs every block of `chain` forward and backward, one at a time (training mode is the
// chain's), at both sizes of `sampling`. Installs the counting allocator
// (core::count_tensor_memory) if nothing has. Throws std::invalid_argument for sizes below 1,
// for neighbours without one thread each or without `chain.copy`, and for a cut that does not
// cut the chain into stages in order.
std::vector<BlockCost> measure_blocks(const BlockChain& chain, const CostSampling& sampling);

// measure_blocks over the blocks of a U-Net-ResNet-`depth` on random images of `image_size`.
// Throws std::invalid_argument for an unknown depth or an image size the encoder cannot halve
// five times.
std::vector<BlockCost> measure_unet_blocks(int64_t depth, int64_t classes,
                                           const core::ImageSize& image_size,
                                           const CostSampling& sampling = {}, int64_t seed = 0);

}  // namespace ferry::models
