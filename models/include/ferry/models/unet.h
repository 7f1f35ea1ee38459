// U-Net for segmentation with a ResNet encoder, laid out as torchvision's ResNets and
// segmentation_models_pytorch's Unet lay theirs out, parameter names included, so weights saved
// from either load by name. The three parts are also registered as stages (see stages.cc):
//   "unet.encoder"  {depth: 18|34|50|101|152, in_channels: 3, seed}
//   "unet.decoder"  {depth, seed}                         (the encoder it follows)
//   "unet.head"     {classes: 1, seed}
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>

#include <cstdint>
#include <vector>

#include "ferry/models/sync_batch_norm.h"

namespace ferry::models {

// Output channels of each feature of a ResNet encoder of `depth` (strides 1, 2, 4, 8, 16, 32;
// the first is the input). Throws std::invalid_argument for an unknown depth.
std::vector<int64_t> resnet_channels(int64_t depth, int64_t in_channels = 3);

// torchvision's ResNet without its classifier. forward returns the six features.
class ResNetEncoderImpl : public torch::nn::Module {
 public:
  explicit ResNetEncoderImpl(int64_t depth, int64_t in_channels = 3);
  std::vector<at::Tensor> forward(const at::Tensor& x);
  const std::vector<int64_t>& out_channels() const { return channels_; }

 private:
  std::vector<int64_t> channels_;
  torch::nn::Conv2d conv1_{nullptr};
  SyncBatchNorm2d bn1_{nullptr};
  torch::nn::Sequential layers_[4];
};
TORCH_MODULE(ResNetEncoder);

// segmentation_models_pytorch's UnetDecoder (batch norm, nearest upsampling, no attention).
// forward takes the encoder's features: all six, or the five after the input.
class UnetDecoderImpl : public torch::nn::Module {
 public:
  explicit UnetDecoderImpl(std::vector<int64_t> encoder_channels,
                           std::vector<int64_t> decoder_channels = {256, 128, 64, 32, 16});
  at::Tensor forward(const std::vector<at::Tensor>& features);
  int64_t out_channels() const { return out_channels_; }

 private:
  torch::nn::ModuleList blocks_{nullptr};
  int64_t out_channels_;
};
TORCH_MODULE(UnetDecoder);

// A 3x3 convolution to `classes` channels (logits; losses take logits).
class SegmentationHeadImpl : public torch::nn::Module {
 public:
  SegmentationHeadImpl(int64_t in_channels, int64_t classes);
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::Conv2d conv_{nullptr};
};
TORCH_MODULE(SegmentationHead);

// The whole model in one process: submodules "encoder", "decoder", "segmentation_head", as in
// segmentation_models_pytorch.Unet.
class UnetImpl : public torch::nn::Module {
 public:
  UnetImpl(int64_t depth, int64_t classes, int64_t in_channels = 3);
  at::Tensor forward(const at::Tensor& x);

  ResNetEncoder encoder{nullptr};
  UnetDecoder decoder{nullptr};
  SegmentationHead segmentation_head{nullptr};
};
TORCH_MODULE(Unet);

// Registers the three stage types, "unet.blocks" (see unet_blocks.h) and "synthetic.mlp" (width,
// layers, seed: balanced stages for pipeline benchmarks), idempotently. Workers that host these
// stages call it.
void register_unet_stages();

}  // namespace ferry::models
