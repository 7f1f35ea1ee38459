// The U-Net's parts as stages a worker can host. The encoder stage returns the five features
// after the input (strides 2 to 32): the decoder never uses the input itself, so it does not
// travel back.
#include <fmt/format.h>
#include <torch/torch.h>

#include <stdexcept>

#include "ferry/models/unet.h"
#include "ferry/models/unet_blocks.h"
#include "ferry/remote_module/stage.h"

namespace ferry::models {
namespace {

using remote_module::config_int;
using remote_module::ModuleStage;
using remote_module::register_stage;
using remote_module::Stage;
using remote_module::StageConfig;

at::Tensor one_tensor(const std::vector<c10::IValue>& inputs, const char* stage) {
  if (inputs.size() != 1 || !inputs[0].isTensor()) {
    throw std::invalid_argument(fmt::format("stage \"{}\" takes one tensor", stage));
  }
  return inputs[0].toTensor();
}

void seed_from(const StageConfig& config) {
  torch::manual_seed(static_cast<uint64_t>(config_int(config, "seed", 0)));
}

std::unique_ptr<Stage> make_encoder(const StageConfig& config) {
  seed_from(config);
  auto net = std::make_shared<ResNetEncoderImpl>(config_int(config, "depth", 34),
                                                 config_int(config, "in_channels", 3));
  return std::make_unique<ModuleStage>(net, [net](std::vector<c10::IValue>& inputs) {
    std::vector<at::Tensor> features = net->forward(one_tensor(inputs, "unet.encoder"));
    return c10::IValue(
        c10::List<at::Tensor>(std::vector<at::Tensor>(features.begin() + 1, features.end())));
  });
}

std::unique_ptr<Stage> make_decoder(const StageConfig& config) {
  seed_from(config);
  int64_t depth = config_int(config, "depth", 34);
  auto net = std::make_shared<UnetDecoderImpl>(resnet_channels(depth));
  return std::make_unique<ModuleStage>(net, [net](std::vector<c10::IValue>& inputs) {
    if (inputs.size() != 1 || !inputs[0].isTensorList()) {
      throw std::invalid_argument("stage \"unet.decoder\" takes the encoder's list of features");
    }
    return c10::IValue(net->forward(inputs[0].toTensorVector()));
  });
}

std::unique_ptr<Stage> make_head(const StageConfig& config) {
  seed_from(config);
  auto net = std::make_shared<SegmentationHeadImpl>(config_int(config, "in_channels", 16),
                                                    config_int(config, "classes", 1));
  return std::make_unique<ModuleStage>(net, [net](std::vector<c10::IValue>& inputs) {
    return c10::IValue(net->forward(one_tensor(inputs, "unet.head")));
  });
}

// "unet.blocks": a range of the U-Net's blocks (unet_blocks.h).
std::unique_ptr<Stage> make_blocks(const StageConfig& config) {
  int64_t depth = config_int(config, "depth", 34);
  int64_t count = static_cast<int64_t>(unet_blocks(depth).size());
  auto net = std::make_shared<UnetBlocksImpl>(
      depth, config_int(config, "classes", 1), config_int(config, "first", 0),
      config_int(config, "last", count), config_int(config, "seed", 0),
      config_int(config, "in_channels", 3));
  if (config_int(config, "freeze_batchnorm", 0) != 0) net->freeze_batchnorm();
  const bool ends_model = net->last() == count;
  auto block_times = [net] {
    std::vector<remote_module::BlockSeconds> out;
    const std::vector<double> forward = net->block_forward_s();
    const std::vector<double> backward = net->block_backward_s();
    for (int64_t k = net->first(); k < net->last(); ++k) {
      const auto i = static_cast<std::size_t>(k - net->first());
      out.push_back({net->blocks()[k].name, forward[i], backward[i]});
    }
    return out;
  };
  return std::make_unique<ModuleStage>(
      net,
      [net, ends_model](std::vector<c10::IValue>& inputs) {
        std::vector<at::Tensor> carry;
        if (inputs.size() == 1 && inputs[0].isTensor()) {
          carry.push_back(inputs[0].toTensor());
        } else if (inputs.size() == 1 && inputs[0].isTensorList()) {
          carry = inputs[0].toTensorVector();
        } else {
          throw std::invalid_argument(
              fmt::format("stage \"unet.blocks\" (blocks {}) takes the image or the "
                          "carry list of the stage before, not {} value{}",
                          net->range_name(), inputs.size(),
                          inputs.size() == 1 ? " of type " + inputs[0].tagKind() : "s"));
        }
        carry = net->forward(std::move(carry));
        if (ends_model) return c10::IValue(carry.back());
        return c10::IValue(c10::List<at::Tensor>(std::move(carry)));
      },
      block_times);
}

// "synthetic.mlp": `layers` times Linear(width, width) then ReLU. Stages of equal width and
// layers cost the same, which is what a pipeline benchmark needs to compare against the ideal.
std::unique_ptr<Stage> make_synthetic_mlp(const StageConfig& config) {
  seed_from(config);
  int64_t width = config_int(config, "width");
  int64_t layers = config_int(config, "layers", 4);
  auto net = std::make_shared<torch::nn::SequentialImpl>();
  for (int64_t i = 0; i < layers; ++i) {
    net->push_back(torch::nn::Linear(width, width));
    net->push_back(torch::nn::ReLU());
  }
  return std::make_unique<ModuleStage>(net, [net](std::vector<c10::IValue>& inputs) {
    return c10::IValue(net->forward(one_tensor(inputs, "synthetic.mlp")));
  });
}

}  // namespace

void register_unet_stages() {
  static bool done = [] {
    register_stage("unet.encoder", make_encoder);
    register_stage("unet.decoder", make_decoder);
    register_stage("unet.head", make_head);
    register_stage("unet.blocks", make_blocks);
    register_stage("synthetic.mlp", make_synthetic_mlp);
    return true;
  }();
  (void)done;
}

}  // namespace ferry::models
