// torchvision's ResNet-18/34 (BasicBlock) and -50/101/152 (Bottleneck, stride on the 3x3
// convolution as in torchvision >= 0.x "v1.5"), classifier removed, returning features at every
// stride as segmentation_models_pytorch's ResNet encoders do.
#include <fmt/format.h>
#include <torch/torch.h>

#include <stdexcept>

#include "ferry/models/unet.h"
#include "models/blocks.h"

namespace ferry::models {
namespace detail {

namespace nn = torch::nn;

namespace {

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

}  // namespace

ResNetLayout resnet_layout(int64_t depth) {
  switch (depth) {
    case 18:
      return {false, {2, 2, 2, 2}};
    case 34:
      return {false, {3, 4, 6, 3}};
    case 50:
      return {true, {3, 4, 6, 3}};
    case 101:
      return {true, {3, 4, 23, 3}};
    case 152:
      return {true, {3, 8, 36, 3}};
    default:
      throw std::invalid_argument(
          fmt::format("no ResNet of depth {} (there are 18, 34, 50, 101, 152)", depth));
  }
}

ResidualBlockImpl::ResidualBlockImpl(bool bottleneck, int64_t in, int64_t planes, int64_t stride)
    : bottleneck_(bottleneck) {
  int64_t out = planes * (bottleneck ? 4 : 1);
  if (bottleneck) {
    conv1_ = register_module("conv1", conv(in, planes, 1, 1));
    bn1_ = register_module("bn1", SyncBatchNorm2d(planes));
    conv2_ = register_module("conv2", conv(planes, planes, 3, stride));
    bn2_ = register_module("bn2", SyncBatchNorm2d(planes));
    conv3_ = register_module("conv3", conv(planes, out, 1, 1));
    bn3_ = register_module("bn3", SyncBatchNorm2d(out));
  } else {
    conv1_ = register_module("conv1", conv(in, planes, 3, stride));
    bn1_ = register_module("bn1", SyncBatchNorm2d(planes));
    conv2_ = register_module("conv2", conv(planes, planes, 3, 1));
    bn2_ = register_module("bn2", SyncBatchNorm2d(planes));
  }
  if (stride != 1 || in != out) {
    downsample_ = register_module("downsample",
                                  nn::Sequential(conv(in, out, 1, stride), SyncBatchNorm2d(out)));
  }
}

at::Tensor ResidualBlockImpl::forward(const at::Tensor& x) {
  at::Tensor y = torch::relu(bn1_(conv1_(x)));
  y = bn2_(conv2_(y));
  if (bottleneck_) y = bn3_(conv3_(torch::relu(y)));
  return torch::relu(y + (downsample_ ? downsample_->forward(x) : x));
}

void init_encoder_convolutions(nn::Module& module) {
  init_convolutions(module, [](at::Tensor& w) {
    nn::init::kaiming_normal_(w, 0.0, torch::kFanOut, torch::kReLU);
  });
}

}  // namespace detail

namespace nn = torch::nn;
using detail::ResidualBlock;

std::vector<int64_t> resnet_channels(int64_t depth, int64_t in_channels) {
  if (detail::resnet_layout(depth).bottleneck) return {in_channels, 64, 256, 512, 1024, 2048};
  return {in_channels, 64, 64, 128, 256, 512};
}

ResNetEncoderImpl::ResNetEncoderImpl(int64_t depth, int64_t in_channels)
    : channels_(resnet_channels(depth, in_channels)) {
  detail::ResNetLayout layout = detail::resnet_layout(depth);
  conv1_ = register_module(
      "conv1", nn::Conv2d(nn::Conv2dOptions(in_channels, 64, 7).stride(2).padding(3).bias(false)));
  bn1_ = register_module("bn1", SyncBatchNorm2d(64));
  int64_t in = 64;
  const int64_t planes[4] = {64, 128, 256, 512};
  for (int l = 0; l < 4; ++l) {
    nn::Sequential layer;
    for (int64_t b = 0; b < layout.blocks[l]; ++b) {
      int64_t stride = (b == 0 && l > 0) ? 2 : 1;
      layer->push_back(ResidualBlock(layout.bottleneck, in, planes[l], stride));
      in = planes[l] * (layout.bottleneck ? 4 : 1);
    }
    layers_[l] = register_module(fmt::format("layer{}", l + 1), layer);
  }
  detail::init_encoder_convolutions(*this);
}

std::vector<at::Tensor> ResNetEncoderImpl::forward(const at::Tensor& x) {
  std::vector<at::Tensor> features{x};
  at::Tensor y = torch::relu(bn1_(conv1_(x)));
  features.push_back(y);
  y = torch::max_pool2d(y, 3, 2, 1);
  for (auto& layer : layers_) {
    y = layer->forward(y);
    features.push_back(y);
  }
  return features;
}

}  // namespace ferry::models
