// What each block of a U-Net costs to train, measured in this process: the figures that
// `--stages N --balance memory|time|parameters` balances and that the stage table shows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::models {

// One block's measured costs. Value type.
struct BlockCost {
  std::string name;
  int64_t parameters = 0;
  int64_t parameter_bytes = 0;
  // Tensor bytes its forward leaves allocated until its backward (what autograd saved, and its
  // output), per sample, as the allocator counts them.
  double activation_bytes_per_sample = 0;
  double output_bytes_per_sample = 0;  // the tensor it makes
  double carry_bytes_per_sample = 0;   // everything it passes on: its output and the skips
  int64_t largest_parameter_bytes = 0;
  double forward_s_per_sample = 0;
  double backward_s_per_sample = 0;
};

// Runs every block of a U-Net-ResNet-`depth` forward and backward, one at a time, on a batch of
// `sample_batch` random images of `image_size` (training mode): one pass to warm up, then
// `timed_passes`, keeping each block's fastest time (at least one; memory is the same in each).
// Installs the counting allocator (core::count_tensor_memory) if nothing has. Throws
// std::invalid_argument for an unknown depth or an image size the encoder cannot halve
// five times.
std::vector<BlockCost> measure_unet_blocks(int64_t depth, int64_t classes, int64_t image_size,
                                           int64_t sample_batch = 2, int64_t seed = 0,
                                           int timed_passes = 2);

}  // namespace ferry::models
