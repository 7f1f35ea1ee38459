// The U-Net as an ordered list of blocks, so that a stage can be any contiguous range of them:
//   "stem"                      encoder.conv1, encoder.bn1 (and ReLU)
//   "layer<l>.<b>"              every residual block of the encoder (max pooling opens layer1.0)
//   "decoder.<i>", i = 0..4     every decoder block, deepest first
//   "head"                      the segmentation head
// Parameter names are segmentation_models_pytorch's ("encoder.layer3.5.conv2.weight",
// "decoder.blocks.2.conv1.0.weight", "segmentation_head.0.bias") whatever the range, so weights
// files and checkpoints fit any partition, and the stages' parameters in stage order are in the
// order of the whole model's.
//
// Between blocks travels a carry: a list of tensors whose last is the current activation and
// whose others are the skip features made so far and not yet used, oldest first. The first block
// of each encoder layer keeps its input as a skip; each decoder block but the last takes the
// newest. Each block is initialised from its own seed (seed * 1000 + its index), so every
// partition of a model of one seed starts from the same weights.
//
// Registered as the stage type "unet.blocks" {depth, classes, first, last, seed, in_channels,
// freeze_batchnorm (0 or 1)}:
// it takes the image (first = 0) or the carry of the stage before, and returns the carry, or the
// logits when its range ends with the head.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ferry::models {

class BlockClock;

enum class BlockKind { Stem, Residual, Decoder, Head };

// One block of the list. Value type.
struct UnetBlock {
  std::string name;
  BlockKind kind = BlockKind::Stem;
  int64_t carry_in = 1;   // tensors in the carry it takes (the image counts as one)
  int64_t carry_out = 1;  // and gives
};

// The blocks of a U-Net with a ResNet-`depth` encoder, in forward order. Throws
// std::invalid_argument for an unknown depth.
std::vector<UnetBlock> unet_blocks(int64_t depth);
// The position of block `name`; throws std::invalid_argument naming it and the blocks
// there are.
int64_t unet_block_index(const std::vector<UnetBlock>& blocks, const std::string& name);

// How many elements at the bottom of the carry blocks [first, last) pass through untouched: a
// range needs only the rest of the carry it takes, and gives back only the rest of its own, so
// the skips below can go straight from the stage that makes them to the one that uses them.
int64_t unet_carry_untouched(const std::vector<UnetBlock>& blocks, int64_t first, int64_t last);

// Blocks [first, last) of the U-Net, in one module.
class UnetBlocksImpl : public torch::nn::Module {
 public:
  UnetBlocksImpl(int64_t depth, int64_t classes, int64_t first, int64_t last, int64_t seed = 0,
                 int64_t in_channels = 3);

  // The carry through every block of the range: the whole carry, or only its elements above
  // those the range passes through untouched (then the result is the same part of its own).
  // Throws std::invalid_argument saying what the range expected when the carry has the
  // wrong number of tensors.
  std::vector<at::Tensor> forward(std::vector<at::Tensor> carry);
  // One block of the range (its index in the whole list) on the carry it takes.
  std::vector<at::Tensor> forward_block(int64_t block, std::vector<at::Tensor> carry);
  // The parameters of one block of the range.
  std::vector<at::Tensor> block_parameters(int64_t block) const;
  // Each block's seconds of forward and of backward so far, in forward() (not forward_block):
  // forwards at the blocks' boundaries, backwards as the autograd nodes each block recorded.
  std::vector<double> block_forward_s() const;
  std::vector<double> block_backward_s() const;

  int64_t first() const { return first_; }
  int64_t last() const { return last_; }
  const std::vector<UnetBlock>& blocks() const { return all_; }
  // "layer2.0..decoder.1" (both ends included).
  std::string range_name() const;

  // Fixes every batch norm's running statistics and affine parameters (they get no gradient),
  // as when fine-tuning from ImageNet weights with small batches: train() leaves them in eval
  // mode from now on.
  void freeze_batchnorm();
  bool batchnorm_frozen() const { return batchnorm_frozen_; }
  void train(bool on = true) override;

 private:
  // The blocks of each part of the U-Net that fall in the range, each seeded from `seed` and its
  // index: the stem (block 0), the encoder's residual blocks, the decoder's and the head.
  void add_stem(int64_t seed, int64_t in_channels);
  void add_encoder(int64_t seed, int64_t depth);
  void add_decoder(int64_t seed, int64_t depth, int64_t in_channels);
  void add_head(int64_t seed, int64_t classes);
  bool wanted(int64_t k) const { return k >= first_ && k < last_; }
  void seed_block(int64_t seed, int64_t k) const;
  using Run = std::function<std::vector<at::Tensor>(std::vector<at::Tensor>)>;
  std::vector<UnetBlock> all_;
  int64_t first_, last_;
  std::vector<Run> runs_;  // one per block of the range
  std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> modules_;  // of each block
  std::shared_ptr<BlockClock> clock_;
  bool batchnorm_frozen_ = false;
};
TORCH_MODULE(UnetBlocks);

}  // namespace ferry::models
