// The U-Net as a list of blocks: the list and its carries, any cut chaining to the whole model
// with the same weights, names and outputs as the one-piece Unet, and the stage type.
#include "ferry/models/unet_blocks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>

#include "ferry/models/compare.h"
#include "ferry/models/unet.h"
#include "ferry/models/weights.h"
#include "ferry/remote_module/stage.h"
#include "ferry/rpc/error.h"
#include "tests/support/error_of.h"

namespace ferry::models {
namespace {

using ferry::testing::error_of;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> names_of(const std::vector<UnetBlock>& blocks) {
  std::vector<std::string> out;
  for (const auto& b : blocks) out.push_back(b.name);
  return out;
}

std::vector<at::Tensor> chain(std::vector<UnetBlocks>& parts, const at::Tensor& images) {
  std::vector<at::Tensor> carry{images};
  for (auto& part : parts) carry = part->forward(carry);
  return carry;
}

TEST(UnetBlocks, TheListHasEveryBlockInForwardOrderWithItsCarry) {
  std::vector<UnetBlock> blocks = unet_blocks(34);
  ASSERT_EQ(blocks.size(), 1u + 16u + 5u + 1u);
  std::vector<std::string> names = names_of(blocks);
  EXPECT_EQ(names[0], "stem");
  EXPECT_EQ(names[1], "layer1.0");
  EXPECT_EQ(names[16], "layer4.2");
  EXPECT_EQ(names[17], "decoder.0");
  EXPECT_EQ(names[22], "head");
  // The carry grows by one skip at the start of each encoder layer and shrinks by one per
  // decoder block that takes one.
  EXPECT_EQ(blocks[unet_block_index(blocks, "layer1.0")].carry_out, 2);
  EXPECT_EQ(blocks[unet_block_index(blocks, "layer4.0")].carry_out, 5);
  EXPECT_EQ(blocks[unet_block_index(blocks, "decoder.0")].carry_in, 5);
  EXPECT_EQ(blocks[unet_block_index(blocks, "decoder.3")].carry_out, 1);
  EXPECT_EQ(blocks[unet_block_index(blocks, "head")].carry_in, 1);
  EXPECT_EQ(unet_blocks(152).size(), 1u + 50u + 5u + 1u);
  EXPECT_THAT(error_of([] { unet_block_index(unet_blocks(18), "layer5.0"); }),
              HasSubstr("the U-Net has no block \"layer5.0\" (its blocks: stem, layer1.0,"));
}

TEST(UnetBlocks, AnyCutChainsToTheWholeModelWithTheSameWeights) {
  at::set_num_threads(1);
  const int64_t n = static_cast<int64_t>(unet_blocks(18).size());
  UnetBlocks whole(18, 1, 0, n, /*seed=*/3);
  torch::manual_seed(5);
  at::Tensor x = torch::randn({2, 3, 64, 64});
  at::Tensor want = whole->forward({x}).back();
  for (std::vector<int64_t> cuts : std::vector<std::vector<int64_t>>{
           {1, n - 1}, {5, 12}, {3}, {1, 2, 3, 4, 9, 11, n - 2, n - 1}}) {
    std::vector<UnetBlocks> parts;
    int64_t first = 0;
    cuts.push_back(n);
    std::vector<std::string> names;
    for (int64_t cut : cuts) {
      parts.emplace_back(18, 1, first, cut, /*seed=*/3);
      for (const auto& p : parts.back()->named_parameters()) names.push_back(p.key());
      first = cut;
    }
    std::vector<at::Tensor> got = chain(parts, x);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(torch::equal(got[0], want)) << "cut into " << parts.size() << " parts";
    // The parts' parameters, in order, are the whole model's.
    std::vector<std::string> whole_names;
    for (const auto& p : whole->named_parameters()) whole_names.push_back(p.key());
    EXPECT_EQ(names, whole_names);
  }
}

// Blocks time themselves as they run: a forward at its boundaries, a backward as the nodes it
// recorded, so that the blocks' parts add up to at most what the whole took (and most of it), and
// a backward run in two passes counts both.
TEST(UnetBlocks, EachBlockTimesItsForwardAndBackwardAsItRuns) {
  at::set_num_threads(1);
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  auto sum = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); };
  const int64_t n = static_cast<int64_t>(unet_blocks(18).size());
  UnetBlocks part(18, 1, 2, n, /*seed=*/3);
  torch::manual_seed(5);
  UnetBlocks head_of_it(18, 1, 0, 2, /*seed=*/3);
  std::vector<at::Tensor> carry;
  {
    torch::NoGradGuard no_grad;
    carry = head_of_it->forward({torch::randn({4, 3, 64, 64})});
  }
  for (at::Tensor& t : carry) t.requires_grad_(true);
  EXPECT_EQ(sum(part->block_forward_s()), 0.0);
  // The parts never exceed the whole; that they are most of it holds unless this thread was
  // descheduled between two nodes, so it must hold in one of three tries (a block whose backward
  // went uncounted fails every try).
  double most_of_backward = 0, most_of_passes = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const double forward_before = sum(part->block_forward_s());
    const double backward_before = sum(part->block_backward_s());
    auto start = Clock::now();
    at::Tensor loss = part->forward(carry).back().sum();
    const double forward = seconds_since(start);
    start = Clock::now();
    loss.backward();
    const double backward = seconds_since(start);
    const std::vector<double> f = part->block_forward_s(), b = part->block_backward_s();
    ASSERT_EQ(f.size(), static_cast<std::size_t>(n - 2));
    ASSERT_EQ(b.size(), f.size());
    for (std::size_t k = 0; k < f.size(); ++k) {
      EXPECT_GT(f[k], 0) << "block " << k;
      EXPECT_GT(b[k], 0) << "block " << k;
    }
    EXPECT_LE(sum(f) - forward_before, forward);
    EXPECT_LE(sum(b) - backward_before, backward);
    most_of_backward = std::max(most_of_backward, (sum(b) - backward_before) / backward);
    // An input pass, then a weight pass over the same graph (a zero-bubble stage's backward).
    loss = part->forward(carry).back().sum();
    const double before = sum(part->block_backward_s());
    start = Clock::now();
    torch::autograd::grad({loss}, carry, {}, /*retain_graph=*/true);
    torch::autograd::grad({loss}, part->parameters());
    const double passes = seconds_since(start);
    EXPECT_LE(sum(part->block_backward_s()) - before, passes);
    most_of_passes = std::max(most_of_passes, (sum(part->block_backward_s()) - before) / passes);
    if (most_of_backward >= 0.5 && most_of_passes >= 0.5) break;
  }
  EXPECT_GE(most_of_backward, 0.5);
  EXPECT_GE(most_of_passes, 0.5);
}

TEST(UnetBlocks, TheWholeListIsTheOnePieceUnetNameForName) {
  at::set_num_threads(1);
  const int64_t n = static_cast<int64_t>(unet_blocks(34).size());
  UnetBlocks blocks(34, 2, 0, n, /*seed=*/1);
  Unet net(34, 2);
  c10::Dict<std::string, at::Tensor> state;
  for (const auto& p : blocks->named_parameters()) state.insert(p.key(), p.value());
  for (const auto& b : blocks->named_buffers()) state.insert(b.key(), b.value());
  LoadReport report = load_state_dict(*net, state);
  EXPECT_TRUE(report.ok()) << report.describe();
  EXPECT_EQ(report.loaded,
            static_cast<int64_t>(net->named_parameters().size() + net->named_buffers().size()));
  blocks->eval();
  net->eval();
  torch::NoGradGuard no_grad;
  at::Tensor x = torch::randn({1, 3, 64, 64});
  EXPECT_LE(max_relative_error(blocks->forward({x}).back(), net->forward(x)), 1e-6);
}

TEST(UnetBlocks, ARangeTakesOnlyTheCarryItReadsAndGivesBackTheSamePart) {
  const std::vector<UnetBlock> blocks = unet_blocks(18);
  auto index_of = [&](const char* name) { return unet_block_index(blocks, name); };
  const auto n = static_cast<int64_t>(blocks.size());
  // layer3.0 keeps its input, the third skip, and nothing below it is read until the decoder.
  EXPECT_EQ(unet_carry_untouched(blocks, index_of("layer3.0"), index_of("decoder.0")), 2);
  EXPECT_EQ(unet_carry_untouched(blocks, index_of("layer1.1"), index_of("decoder.0")), 1);
  // decoder.0 takes the deepest skip, decoder.3 the shallowest: they reach the carry's bottom.
  EXPECT_EQ(unet_carry_untouched(blocks, index_of("decoder.0"), index_of("decoder.1")), 3);
  EXPECT_EQ(unet_carry_untouched(blocks, index_of("decoder.0"), index_of("decoder.4")), 0);
  EXPECT_EQ(unet_carry_untouched(blocks, 0, n), 0);

  torch::NoGradGuard no_grad;
  UnetBlocks before(18, 1, 0, index_of("layer3.0"), 5);
  UnetBlocks middle(18, 1, index_of("layer3.0"), index_of("decoder.0"), 5);
  before->eval();
  middle->eval();
  std::vector<at::Tensor> carry = before->forward({torch::randn({1, 3, 64, 64})});
  ASSERT_EQ(carry.size(), 3u);
  std::vector<at::Tensor> whole = middle->forward(carry);
  std::vector<at::Tensor> part = middle->forward({carry.back()});
  ASSERT_EQ(whole.size(), 5u);
  ASSERT_EQ(part.size(), 3u);
  for (size_t i = 0; i < part.size(); ++i) EXPECT_TRUE(torch::equal(part[i], whole[i + 2])) << i;
  EXPECT_THAT(error_of([&] {
                middle->forward({carry[1], carry[2]});
              }),
              HasSubstr("U-Net blocks layer3.0..layer4.1 take a carry of 3 tensors (the "
                        "activation and 2 skip features), or its top 1, but got 2 tensors"));
}

TEST(UnetBlocks, AStageGivenTheWrongCarrySaysWhatItTakes) {
  const std::vector<UnetBlock> blocks = unet_blocks(18);
  UnetBlocks decoder(18, 1, unet_block_index(blocks, "decoder.0"),
                     static_cast<int64_t>(blocks.size()));
  EXPECT_THAT(error_of([&] {
                decoder->forward({torch::zeros({1, 512, 2, 2})});
              }),
              HasSubstr("U-Net blocks decoder.0..head take a carry of 5 tensors (the activation "
                        "and 4 skip features) but got 1 tensor"));
  EXPECT_THAT(error_of([] { UnetBlocks(18, 1, 4, 4); }),
              HasSubstr("blocks [4, 4) are not a range of the U-Net-ResNet-18's 15 blocks"));

  register_unet_stages();
  remote_module::StageConfig config = remote_module::stage_config();
  config.insert("depth", int64_t{18});
  config.insert("first", int64_t{1});
  config.insert("last", int64_t{3});
  auto stage = remote_module::make_stage("unet.blocks", config);
  EXPECT_THAT(error_of([&] { stage->forward({c10::IValue(int64_t{1})}); }),
              HasSubstr("stage \"unet.blocks\" (blocks layer1.0..layer1.1) takes the image or the "
                        "carry list of the stage before, not 1 value of type Int"));
}

TEST(UnetBlocks, StagesOfTheBlockTypeReturnTheCarryAndTheLastTheLogits) {
  register_unet_stages();
  const int64_t n = static_cast<int64_t>(unet_blocks(18).size());
  auto make = [&](int64_t first, int64_t last) {
    remote_module::StageConfig config = remote_module::stage_config();
    config.insert("depth", int64_t{18});
    config.insert("first", first);
    config.insert("last", last);
    return remote_module::make_stage("unet.blocks", config);
  };
  auto front = make(0, 5), back = make(5, n);
  c10::IValue carry = front->forward({torch::randn({2, 3, 64, 64})});
  ASSERT_TRUE(carry.isTensorList());
  EXPECT_EQ(carry.toTensorList().size(), 3u);  // the stem's and layer1's features, layer2's now
  c10::IValue logits = back->forward({carry});
  ASSERT_TRUE(logits.isTensor());
  EXPECT_THAT(logits.toTensor().sizes().vec(), ElementsAre(2, 1, 64, 64));
}

TEST(UnetBlocks, FrozenBatchNormKeepsItsStatisticsAndGetsNoGradientInTrainMode) {
  register_unet_stages();
  remote_module::StageConfig config = remote_module::stage_config();
  config.insert("depth", int64_t{18});
  config.insert("first", int64_t{0});
  config.insert("last", int64_t{3});
  config.insert("freeze_batchnorm", int64_t{1});
  auto stage = remote_module::make_stage("unet.blocks", config);
  stage->train(true);
  auto buffers_before = stage->named_buffers();
  std::map<std::string, at::Tensor> before;
  for (auto& [name, t] : buffers_before) before[name] = t.clone();
  at::Tensor images = torch::randn({2, 3, 32, 32}).requires_grad_();
  c10::IValue carry = stage->forward({images});
  at::Tensor loss = carry.toTensorList().get(carry.toTensorList().size() - 1).sum();
  loss.backward();
  int frozen = 0, trained = 0;
  for (auto& [name, p] : stage->named_parameters()) {
    const bool batchnorm = name.find("bn") != std::string::npos;
    EXPECT_EQ(p.requires_grad(), !batchnorm) << name;
    EXPECT_EQ(p.grad().defined(), !batchnorm) << name;
    (batchnorm ? frozen : trained) += 1;
  }
  EXPECT_GT(frozen, 0);
  EXPECT_GT(trained, 0);
  for (auto& [name, t] : stage->named_buffers()) {
    EXPECT_TRUE(torch::equal(t, before.at(name))) << name << " moved in a training forward";
  }
  EXPECT_TRUE(images.grad().defined());
}

}  // namespace
}  // namespace ferry::models
