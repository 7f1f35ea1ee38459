// The U-Net's block list and block ranges. Modules are registered under the containers of
// segmentation_models_pytorch's Unet ("encoder" > "layer2" > "0"), made on demand, so a range's
// parameter names are the whole model's.
#include "ferry/models/unet_blocks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <stdexcept>

#include "ferry/core/fail.h"
#include "ferry/models/unet.h"
#include "models/block_clock.h"
#include "models/blocks.h"

namespace ferry::models {
namespace {

using core::fail;

namespace nn = torch::nn;

constexpr int64_t kDecoderChannels[5] = {256, 128, 64, 32, 16};
constexpr int64_t kPlanes[4] = {64, 128, 256, 512};

// The container `path` ("encoder.layer2") under `root`, registered on first use.
std::shared_ptr<nn::Module> container(nn::Module& root, const std::vector<std::string>& path) {
  nn::Module* parent = &root;
  std::shared_ptr<nn::Module> node;
  for (const std::string& name : path) {
    auto children = parent->named_children();
    if (auto* found = children.find(name)) {
      node = *found;
    } else {
      node = parent->register_module(name, std::make_shared<nn::Module>());
    }
    parent = node.get();
  }
  return node;
}

at::Tensor pop(std::vector<at::Tensor>& carry) {
  at::Tensor last = std::move(carry.back());
  carry.pop_back();
  return last;
}

}  // namespace

std::vector<UnetBlock> unet_blocks(int64_t depth) {
  detail::ResNetLayout layout = detail::resnet_layout(depth);
  std::vector<UnetBlock> blocks;
  int64_t carry = 1;
  auto add = [&](std::string name, BlockKind kind, int64_t out) {
    blocks.push_back({std::move(name), kind, carry, out});
    carry = out;
  };
  add("stem", BlockKind::Stem, 1);
  for (int l = 0; l < 4; ++l) {
    for (int64_t b = 0; b < layout.blocks[l]; ++b) {
      add(fmt::format("layer{}.{}", l + 1, b), BlockKind::Residual, b == 0 ? carry + 1 : carry);
    }
  }
  for (int i = 0; i < 5; ++i) {
    add(fmt::format("decoder.{}", i), BlockKind::Decoder, i < 4 ? carry - 1 : carry);
  }
  add("head", BlockKind::Head, 1);
  return blocks;
}

int64_t unet_block_index(const std::vector<UnetBlock>& blocks, const std::string& name) {
  for (size_t k = 0; k < blocks.size(); ++k) {
    if (blocks[k].name == name) return static_cast<int64_t>(k);
  }
  std::vector<std::string> names;
  for (const UnetBlock& block : blocks) names.push_back(block.name);
  fail(fmt::format("the U-Net has no block \"{}\" (its blocks: {})", name, fmt::join(names, ", ")));
}

int64_t unet_carry_untouched(const std::vector<UnetBlock>& blocks, int64_t first, int64_t last) {
  int64_t low = blocks.at(first).carry_in;
  for (int64_t k = first; k < last; ++k) {
    const UnetBlock& block = blocks.at(k);
    // A block reads the activation on top and, when its carry shrinks, the skip beneath it.
    const int64_t reads = block.carry_out < block.carry_in ? 2 : 1;
    low = std::min(low, block.carry_in - reads);
  }
  return low;
}

UnetBlocksImpl::UnetBlocksImpl(int64_t depth, int64_t classes, int64_t first, int64_t last,
                               int64_t seed, int64_t in_channels)
    : all_(unet_blocks(depth)), first_(first), last_(last) {
  const auto n = static_cast<int64_t>(all_.size());
  if (first < 0 || last > n || first >= last) {
    fail(fmt::format("blocks [{}, {}) are not a range of the U-Net-ResNet-{}'s {} blocks", first,
                     last, depth, n));
  }
  add_stem(seed, in_channels);
  add_encoder(seed, depth);
  add_decoder(seed, depth, in_channels);
  add_head(seed, classes);
  clock_ = std::make_shared<BlockClock>(runs_.size());
}

void UnetBlocksImpl::seed_block(int64_t seed, int64_t k) const {
  torch::manual_seed(static_cast<uint64_t>(seed * 1000 + k));
}

void UnetBlocksImpl::add_stem(int64_t seed, int64_t in_channels) {
  if (!wanted(0)) return;
  seed_block(seed, 0);
  auto encoder = container(*this, {"encoder"});
  auto conv1 = encoder->register_module(
      "conv1", nn::Conv2d(nn::Conv2dOptions(in_channels, 64, 7).stride(2).padding(3).bias(false)));
  auto bn1 = encoder->register_module("bn1", SyncBatchNorm2d(64));
  detail::init_encoder_convolutions(*conv1);
  runs_.push_back([conv1, bn1](std::vector<at::Tensor> carry) {
    carry.back() = torch::relu(bn1->forward(conv1->forward(carry.back())));
    return carry;
  });
  modules_.push_back({conv1, bn1});
}

void UnetBlocksImpl::add_encoder(int64_t seed, int64_t depth) {
  const detail::ResNetLayout layout = detail::resnet_layout(depth);
  const int64_t expansion = layout.bottleneck ? 4 : 1;
  int64_t k = 1;  // after the stem
  int64_t in = 64;
  for (int l = 0; l < 4; ++l) {
    for (int64_t b = 0; b < layout.blocks[l]; ++b, ++k) {
      const int64_t stride = (b == 0 && l > 0) ? 2 : 1;
      const int64_t block_in = in;
      in = kPlanes[l] * expansion;
      if (!wanted(k)) continue;
      seed_block(seed, k);
      auto layer = container(*this, {"encoder", fmt::format("layer{}", l + 1)});
      auto block = layer->register_module(
          std::to_string(b),
          detail::ResidualBlock(layout.bottleneck, block_in, kPlanes[l], stride).ptr());
      detail::init_encoder_convolutions(*block);
      const bool opens_layer = b == 0, pools = l == 0 && b == 0;
      runs_.push_back([block, opens_layer, pools](std::vector<at::Tensor> carry) {
        // The first block of a layer keeps its input: it is the skip of that stride.
        at::Tensor x = opens_layer ? carry.back() : pop(carry);
        if (pools) x = torch::max_pool2d(x, 3, 2, 1);
        carry.push_back(block->forward(x));
        return carry;
      });
      modules_.push_back({block});
    }
  }
}

void UnetBlocksImpl::add_decoder(int64_t seed, int64_t depth, int64_t in_channels) {
  const std::vector<int64_t> channels = resnet_channels(depth, in_channels);
  // Skips deepest first; the input image is never one.
  const int64_t skips[5] = {channels[4], channels[3], channels[2], channels[1], 0};
  int64_t k = static_cast<int64_t>(all_.size()) - 6;  // the decoder's 5 blocks, then the head
  int64_t in = channels[5];
  for (int i = 0; i < 5; ++i, ++k) {
    const int64_t block_in = in;
    in = kDecoderChannels[i];
    if (!wanted(k)) continue;
    seed_block(seed, k);
    auto blocks = container(*this, {"decoder", "blocks"});
    auto block = blocks->register_module(
        std::to_string(i), detail::DecoderBlock(block_in, skips[i], kDecoderChannels[i]).ptr());
    detail::init_decoder_convolutions(*block);
    const bool has_skip = skips[i] > 0;
    runs_.push_back([block, has_skip](std::vector<at::Tensor> carry) {
      at::Tensor x = pop(carry);
      at::Tensor skip = has_skip ? pop(carry) : at::Tensor();
      carry.push_back(block->forward(x, skip));
      return carry;
    });
    modules_.push_back({block});
  }
}

void UnetBlocksImpl::add_head(int64_t seed, int64_t classes) {
  const int64_t k = static_cast<int64_t>(all_.size()) - 1;
  if (!wanted(k)) return;
  seed_block(seed, k);
  auto head = container(*this, {"segmentation_head"});
  // "0": segmentation_models_pytorch's head is a Sequential whose convolution comes first.
  auto conv = head->register_module(
      "0", nn::Conv2d(nn::Conv2dOptions(kDecoderChannels[4], classes, 3).padding(1)));
  nn::init::xavier_uniform_(conv->weight);
  nn::init::zeros_(conv->bias);
  runs_.push_back([conv](std::vector<at::Tensor> carry) {
    carry.back() = conv->forward(carry.back());
    return carry;
  });
  modules_.push_back({conv});
}

std::string UnetBlocksImpl::range_name() const {
  if (last_ - first_ == 1) return all_[first_].name;
  return fmt::format("{}..{}", all_[first_].name, all_[last_ - 1].name);
}

std::vector<at::Tensor> UnetBlocksImpl::forward(std::vector<at::Tensor> carry) {
  const int64_t expected = all_[first_].carry_in;
  const int64_t needed = expected - unet_carry_untouched(all_, first_, last_);
  const auto got = static_cast<int64_t>(carry.size());
  if (got != expected && got != needed) {
    auto tensors = [](int64_t n) {
      return n == 1 ? std::string("one tensor")
                    : fmt::format("a carry of {} tensors (the activation and {} skip features)", n,
                                  n - 1);
    };
    fail(fmt::format("U-Net blocks {} take {}{} but got {} tensor{}", range_name(),
                     tensors(expected),
                     needed == expected ? "" : fmt::format(", or its top {},", needed), got,
                     got == 1 ? "" : "s"));
  }
  for (std::size_t k = 0; k < runs_.size(); ++k) carry = clock_->run(k, runs_[k], std::move(carry));
  return carry;
}

std::vector<at::Tensor> UnetBlocksImpl::forward_block(int64_t block,
                                                      std::vector<at::Tensor> carry) {
  if (block < first_ || block >= last_) {
    fail(fmt::format("block {} is not among U-Net blocks {}", block, range_name()));
  }
  return runs_[block - first_](std::move(carry));
}

std::vector<at::Tensor> UnetBlocksImpl::block_parameters(int64_t block) const {
  if (block < first_ || block >= last_) {
    fail(fmt::format("block {} is not among U-Net blocks {}", block, range_name()));
  }
  std::vector<at::Tensor> out;
  for (const auto& module : modules_[block - first_]) {
    for (const at::Tensor& p : module->parameters()) out.push_back(p);
  }
  return out;
}

std::vector<double> UnetBlocksImpl::block_forward_s() const { return clock_->forward_s(); }
std::vector<double> UnetBlocksImpl::block_backward_s() const { return clock_->backward_s(); }

void UnetBlocksImpl::freeze_batchnorm() {
  batchnorm_frozen_ = true;
  for (const auto& module : modules(/*include_self=*/false)) {
    if (!dynamic_cast<SyncBatchNorm2dImpl*>(module.get())) continue;
    for (at::Tensor& p : module->parameters()) p.requires_grad_(false);
  }
  train(is_training());
}

void UnetBlocksImpl::train(bool on) {
  nn::Module::train(on);
  if (!batchnorm_frozen_) return;
  for (const auto& module : modules(/*include_self=*/false)) {
    if (dynamic_cast<SyncBatchNorm2dImpl*>(module.get())) module->train(false);
  }
}

}  // namespace ferry::models
