// The U-Net's layout: parameter counts equal segmentation_models_pytorch's, feature strides,
// and the stages equal the whole model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "ferry/models/unet.h"
#include "ferry/remote_module/stage.h"

namespace ferry::models {
namespace {

int64_t count(torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

TEST(Unet, Resnet34PartsHaveSegmentationModelsPytorchParameterCounts) {
  // smp.Unet("resnet34", classes=1): 24,436,369 parameters.
  Unet net(34, 1);
  EXPECT_EQ(count(*net->encoder), 21284672);
  EXPECT_EQ(count(*net->decoder), 3151552);
  EXPECT_EQ(count(*net->segmentation_head), 145);
  EXPECT_EQ(count(*net), 24436369);
}

TEST(Unet, ParameterNamesFollowTorchvisionAndSmp) {
  Unet net(50, 2);
  auto names = net->named_parameters(true);
  for (const char* name :
       {"encoder.conv1.weight", "encoder.bn1.bias", "encoder.layer1.0.conv3.weight",
        "encoder.layer4.2.bn3.weight", "encoder.layer2.0.downsample.0.weight",
        "encoder.layer2.0.downsample.1.weight", "decoder.blocks.0.conv1.0.weight",
        "decoder.blocks.4.conv2.1.bias", "segmentation_head.0.weight",
        "segmentation_head.0.bias"}) {
    EXPECT_NE(names.find(name), nullptr) << name;
  }
  EXPECT_EQ(net->named_buffers(true).find("encoder.bn1.running_mean")->numel(), 64);
}

TEST(Unet, EncoderFeaturesAreAtStrides1To32) {
  ResNetEncoder encoder(18);
  auto features = encoder->forward(torch::randn({1, 3, 64, 64}));
  ASSERT_EQ(features.size(), 6u);
  const int64_t channels[] = {3, 64, 64, 128, 256, 512};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(features[i].size(1), channels[i]);
    EXPECT_EQ(features[i].size(2), 64 >> i);
  }
}

TEST(Unet, UnknownDepthIsAClearError) {
  try {
    ResNetEncoder encoder(42);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no ResNet of depth 42"), std::string::npos);
  }
}

TEST(Unet, StagesTogetherEqualTheWholeModel) {
  register_unet_stages();
  remote_module::StageConfig config = remote_module::stage_config();
  config.insert("depth", 18);
  auto encoder = remote_module::make_stage("unet.encoder", config);
  auto decoder = remote_module::make_stage("unet.decoder", config);
  auto head = remote_module::make_stage("unet.head", config);
  Unet net(18, 1);
  {
    torch::NoGradGuard no_grad;
    auto params = net->named_parameters(true);
    auto buffers = net->named_buffers(true);
    const std::pair<const char*, remote_module::Stage*> parts[] = {
        {"encoder.", encoder.get()}, {"decoder.", decoder.get()}, {"segmentation_head.", head.get()}};
    for (const auto& [prefix, stage] : parts) {
      for (auto named : {stage->named_parameters(), stage->named_buffers()}) {
        for (auto& [name, t] : named) {
          at::Tensor* target = params.find(prefix + name);
          if (!target) target = buffers.find(prefix + name);
          ASSERT_NE(target, nullptr) << prefix << name;
          target->copy_(t);
        }
      }
    }
  }
  at::Tensor x = torch::randn({2, 3, 32, 32});
  at::Tensor split = head->forward({decoder->forward({encoder->forward({x})})}).toTensor();
  at::Tensor whole = net->forward(x);
  EXPECT_EQ(split.sizes(), (std::vector<int64_t>{2, 1, 32, 32}));
  EXPECT_TRUE(torch::allclose(split, whole, 1e-5, 1e-6));
}

}  // namespace
}  // namespace ferry::models
