// Block costs: the line fitted through two timings, a fitted cost against a third size, and every
// block of a U-Net measured.
#include "ferry/models/block_costs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ferry/models/unet.h"
#include "ferry/models/unet_blocks.h"
#include "tests/support/error_of.h"

namespace ferry::models {
namespace {

using ferry::testing::error_of;
using ::testing::DoubleNear;
using ::testing::HasSubstr;

TEST(FitPassCost, TwoTimingsOnALineGiveItsFixedPartAndItsPartPerSample) {
  const PassCost cost = fit_pass_cost(16, 0.010 + 16 * 0.002, 64, 0.010 + 64 * 0.002);
  EXPECT_THAT(cost.fixed_s, DoubleNear(0.010, 1e-12));
  EXPECT_THAT(cost.per_sample_s, DoubleNear(0.002, 1e-12));
  EXPECT_THAT(cost.at(40), DoubleNear(0.090, 1e-12));
  const PassCost swapped = fit_pass_cost(64, 0.010 + 64 * 0.002, 16, 0.010 + 16 * 0.002);
  EXPECT_THAT(swapped.fixed_s, DoubleNear(0.010, 1e-12));
  EXPECT_THAT(swapped.per_sample_s, DoubleNear(0.002, 1e-12));
}

TEST(FitPassCost, AFasterLargerSizeIsAFixedCost) {
  const PassCost cost = fit_pass_cost(8, 0.30, 16, 0.20);
  EXPECT_DOUBLE_EQ(cost.per_sample_s, 0);
  EXPECT_DOUBLE_EQ(cost.fixed_s, 0.25);
}

TEST(FitPassCost, ALineBelowZeroAtNoSamplesGoesThroughTheOrigin) {
  // 8 samples in 0.1 s, 16 in 0.3 s: the line through both is -0.1 s at none.
  const PassCost cost = fit_pass_cost(8, 0.1, 16, 0.3);
  EXPECT_DOUBLE_EQ(cost.fixed_s, 0);
  EXPECT_THAT(cost.per_sample_s, DoubleNear((8 * 0.1 + 16 * 0.3) / (64.0 + 256.0), 1e-15));
  const PassCost one_size = fit_pass_cost(4, 0.2, 4, 0.2);
  EXPECT_DOUBLE_EQ(one_size.fixed_s, 0);
  EXPECT_DOUBLE_EQ(one_size.per_sample_s, 0.05);
}

// Three fully connected blocks of 1024 features, as the synthetic stages are made.
BlockChain synthetic_chain(std::vector<torch::nn::Linear>& layers) {
  torch::manual_seed(0);
  for (int k = 0; k < 3; ++k) layers.emplace_back(1024, 1024);
  BlockChain chain;
  chain.names = {"fc0", "fc1", "fc2"};
  chain.forward = [&layers](int64_t k, std::vector<at::Tensor> carry) {
    return std::vector<at::Tensor>{torch::relu(layers[k]->forward(carry.back()))};
  };
  chain.parameters = [&layers](int64_t k) { return layers[k]->parameters(); };
  chain.input = [](int64_t samples) {
    return std::vector<at::Tensor>{torch::randn({samples, 1024})};
  };
  return chain;
}

TEST(BlockCosts, AFittedCostPredictsAThirdSizeWithinFifteenPercent) {
  std::vector<torch::nn::Linear> layers;
  const BlockChain chain = synthetic_chain(layers);
  CostSampling sampling;
  sampling.samples = 64;
  sampling.second_samples = 16;
  sampling.threads = 1;
  sampling.timed_passes = 5;
  const std::vector<BlockCost> fitted = measure_blocks(chain, sampling);
  // Timed at 40 samples alone, the line through the origin is the measured time itself.
  sampling.samples = 40;
  sampling.second_samples = 40;
  const std::vector<BlockCost> at_40 = measure_blocks(chain, sampling);
  ASSERT_EQ(fitted.size(), 3u);
  for (size_t k = 0; k < fitted.size(); ++k) {
    const double measured = at_40[k].train_s(40);
    EXPECT_THAT(fitted[k].train_s(40), DoubleNear(measured, 0.15 * measured)) << fitted[k].name;
    EXPECT_EQ(fitted[k].parameters, 1024 * 1024 + 1024);
    EXPECT_DOUBLE_EQ(fitted[k].output_bytes_per_sample, 1024.0 * 4);
  }
}

TEST(BlockCosts, ASizeBelowOneIsRefused) {
  std::vector<torch::nn::Linear> layers;
  CostSampling sampling;
  sampling.samples = 0;
  EXPECT_THAT(error_of([&] { measure_blocks(synthetic_chain(layers), sampling); }),
              HasSubstr("blocks are timed on at least one sample, not 0"));
}

TEST(BlockCosts, EveryUnetBlockIsMeasuredAndTheParametersAddUp) {
  std::vector<BlockCost> costs = measure_unet_blocks(18, 1, 64);
  ASSERT_EQ(costs.size(), unet_blocks(18).size());
  int64_t parameters = 0;
  for (const BlockCost& c : costs) {
    parameters += c.parameters;
    EXPECT_GT(c.activation_bytes_per_sample, 0) << c.name;
    EXPECT_GE(c.activation_bytes_per_sample, c.output_bytes_per_sample) << c.name;
    EXPECT_GT(c.train_s(2), 0) << c.name;
  }
  Unet net(18, 1);
  int64_t want = 0;
  for (const auto& p : net->parameters()) want += p.numel();
  EXPECT_EQ(parameters, want);
  // The stem's output alone is 64 channels at half of 64 x 64, in floats.
  EXPECT_DOUBLE_EQ(costs[0].output_bytes_per_sample, 64.0 * 32 * 32 * 4);
  // Autograd keeps more than the output of a residual block (its convolutions' inputs).
  EXPECT_GT(costs[2].activation_bytes_per_sample, 2 * costs[2].output_bytes_per_sample);
  EXPECT_THAT(error_of([] { measure_unet_blocks(18, 1, 48); }),
              HasSubstr("image size 48 is not a multiple of 32"));
}

}  // namespace
}  // namespace ferry::models
