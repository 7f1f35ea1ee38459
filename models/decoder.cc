// segmentation_models_pytorch's U-Net decoder and head, and the whole U-Net. Each decoder block
// doubles the resolution (nearest), concatenates the encoder feature of that stride, and applies
// conv-BN-ReLU twice; the deepest feature is the decoder's input and the input image is no skip.
#include <fmt/format.h>
#include <torch/torch.h>

#include <stdexcept>

#include "ferry/models/unet.h"
#include "models/blocks.h"

namespace ferry::models {
namespace detail {

namespace nn = torch::nn;

namespace {

nn::Sequential conv_bn_relu(int64_t in, int64_t out) {
  return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1).bias(false)),
                        SyncBatchNorm2d(out), nn::ReLU(nn::ReLUOptions(true)));
}

}  // namespace

DecoderBlockImpl::DecoderBlockImpl(int64_t in, int64_t skip, int64_t out)
    : conv1_(register_module("conv1", conv_bn_relu(in + skip, out))),
      conv2_(register_module("conv2", conv_bn_relu(out, out))) {}

at::Tensor DecoderBlockImpl::forward(at::Tensor x, const at::Tensor& skip) {
  x = torch::upsample_nearest2d(x, {x.size(2) * 2, x.size(3) * 2});
  if (skip.defined()) x = torch::cat({x, skip}, 1);
  return conv2_->forward(conv1_->forward(x));
}

void init_decoder_convolutions(nn::Module& module) {
  init_convolutions(module, [](at::Tensor& w) {
    nn::init::kaiming_uniform_(w, 0.0, torch::kFanIn, torch::kReLU);
  });
}

}  // namespace detail

namespace nn = torch::nn;
using detail::DecoderBlock;

UnetDecoderImpl::UnetDecoderImpl(std::vector<int64_t> encoder_channels,
                                 std::vector<int64_t> decoder_channels) {
  if (encoder_channels.size() != 6 || decoder_channels.size() != 5) {
    throw std::invalid_argument(
        fmt::format("a U-Net decoder takes 6 encoder channels and 5 decoder "
                    "channels, got {} and {}",
                    encoder_channels.size(), decoder_channels.size()));
  }
  // Deepest first; the stride-1 feature (the input) is never a skip.
  std::vector<int64_t> skips(encoder_channels.rbegin() + 1, encoder_channels.rend() - 1);
  skips.push_back(0);
  blocks_ = register_module("blocks", nn::ModuleList());
  int64_t in = encoder_channels.back();
  for (size_t i = 0; i < decoder_channels.size(); ++i) {
    blocks_->push_back(DecoderBlock(in, skips[i], decoder_channels[i]));
    in = decoder_channels[i];
  }
  out_channels_ = in;
  detail::init_decoder_convolutions(*this);
}

at::Tensor UnetDecoderImpl::forward(const std::vector<at::Tensor>& features) {
  if (features.size() != 5 && features.size() != 6) {
    throw std::invalid_argument(
        fmt::format("the U-Net decoder takes the encoder's 6 features (or the 5 "
                    "after the input) but got {} tensors",
                    features.size()));
  }
  // Skips deepest first, after the head feature; the last block has none.
  std::vector<at::Tensor> skips(features.rbegin(), features.rbegin() + 5);
  at::Tensor x = skips.front();
  for (size_t i = 0; i < blocks_->size(); ++i) {
    at::Tensor skip = i + 1 < skips.size() ? skips[i + 1] : at::Tensor();
    x = blocks_[i]->as<DecoderBlock>()->forward(x, skip);
  }
  return x;
}

SegmentationHeadImpl::SegmentationHeadImpl(int64_t in_channels, int64_t classes)
    // "0": segmentation_models_pytorch's head is a Sequential whose convolution comes first.
    : conv_(
          register_module("0", nn::Conv2d(nn::Conv2dOptions(in_channels, classes, 3).padding(1)))) {
  nn::init::xavier_uniform_(conv_->weight);
  nn::init::zeros_(conv_->bias);
}

at::Tensor SegmentationHeadImpl::forward(const at::Tensor& x) { return conv_(x); }

UnetImpl::UnetImpl(int64_t depth, int64_t classes, int64_t in_channels)
    : encoder(register_module("encoder", ResNetEncoder(depth, in_channels))),
      decoder(register_module("decoder", UnetDecoder(resnet_channels(depth, in_channels)))),
      segmentation_head(register_module("segmentation_head",
                                        SegmentationHead(decoder->out_channels(), classes))) {}

at::Tensor UnetImpl::forward(const at::Tensor& x) { return segmentation_head(decoder(encoder(x))); }

}  // namespace ferry::models
