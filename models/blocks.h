// The building blocks shared by the whole U-Net (unet.h) and its block ranges (unet_blocks.h):
// torchvision's residual blocks and segmentation_models_pytorch's decoder block, with their
// parameter names. Private to models/.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>

#include "ferry/models/sync_batch_norm.h"

#include <cstdint>
#include <functional>

namespace ferry::models::detail {

// Residual blocks per layer of a ResNet of `depth`, and whether they are bottlenecks. Throws
// std::invalid_argument listing the depths there are for any other.
struct ResNetLayout {
  bool bottleneck;
  int64_t blocks[4];
};
ResNetLayout resnet_layout(int64_t depth);

// BasicBlock and Bottleneck in one class: the parameter names are torchvision's either way.
class ResidualBlockImpl : public torch::nn::Module {
 public:
  ResidualBlockImpl(bool bottleneck, int64_t in, int64_t planes, int64_t stride);
  at::Tensor forward(const at::Tensor& x);

 private:
  bool bottleneck_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  SyncBatchNorm2d bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  torch::nn::Sequential downsample_{nullptr};
};
TORCH_MODULE(ResidualBlock);

// Doubles the resolution (nearest), concatenates the skip feature if there is one, and applies
// conv-BN-ReLU twice.
class DecoderBlockImpl : public torch::nn::Module {
 public:
  DecoderBlockImpl(int64_t in, int64_t skip, int64_t out);
  at::Tensor forward(at::Tensor x, const at::Tensor& skip);

 private:
  torch::nn::Sequential conv1_, conv2_;
};
TORCH_MODULE(DecoderBlock);

// Applies `init` to the weight of every convolution in `module`, itself included. Not
// modules(/*include_self=*/true): that needs a module already owned by a shared_ptr, and
// constructors call this.
inline void init_convolutions(torch::nn::Module& module,
                              const std::function<void(at::Tensor&)>& init) {
  auto visit = [&](torch::nn::Module& m) {
    if (auto* c = m.as<torch::nn::Conv2d>()) init(c->weight);
  };
  visit(module);
  for (auto& child : module.modules(/*include_self=*/false)) visit(*child);
}

// The initialisations of segmentation_models_pytorch: He (fan out) for the encoder's
// convolutions, He uniform (fan in) for the decoder's, Xavier for the head's.
void init_encoder_convolutions(torch::nn::Module& module);
void init_decoder_convolutions(torch::nn::Module& module);

}  // namespace ferry::models::detail
