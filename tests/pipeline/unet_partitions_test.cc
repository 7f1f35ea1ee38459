// The U-Net cut at any block boundaries over 2 to 6 workers (balanced, by hand, one block per
// stage at the ends) computes the one-process model's loss and gradients, in plain steps with
// activations going stage to stage and in pipelined steps. Every partition of one seed starts
// from the same weights, so the reference is the whole block list built here.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ferry/dist_autograd/context.h"
#include "ferry/models/compare.h"
#include "ferry/models/remote_unet.h"
#include "ferry/models/unet_blocks.h"
#include "ferry/pipeline/partition.h"
#include "ferry/pipeline/pipeline.h"
#include "tests/support/cluster.h"

namespace ferry {
namespace {

using models::RemoteUnet;
using testing::LocalWorld;

constexpr int64_t kDepth = 18;
constexpr int64_t kSeed = 2;

// One intra-op thread everywhere, so that both sides add their floats in the same order.
LocalWorld::Settings six_deterministic_workers() {
  at::set_num_threads(1);
  LocalWorld::Settings settings;
  settings.peer_names = {"w1", "w2", "w3", "w4", "w5", "w6"};
  settings.env["OMP_NUM_THREADS"] = "1";
  return settings;
}

std::vector<RemoteUnet::StagePlan> plan_of(const std::vector<pipeline::Range>& ranges) {
  std::vector<RemoteUnet::StagePlan> plan;
  for (size_t k = 0; k < ranges.size(); ++k) {
    plan.push_back(
        {fmt::format("stage{}", k), ranges[k].begin, ranges[k].end, fmt::format("w{}", k + 1), ""});
  }
  return plan;
}

struct Partition {
  std::string what;
  std::vector<pipeline::Range> ranges;
};

std::vector<Partition> partitions() {
  const std::vector<models::UnetBlock> blocks = models::unet_blocks(kDepth);
  std::vector<std::string> names;
  for (const auto& b : blocks) names.push_back(b.name);
  const auto n = static_cast<int64_t>(blocks.size());
  models::UnetBlocks whole(kDepth, 1, 0, n);
  std::vector<double> parameters;
  for (int64_t k = 0; k < n; ++k) {
    double count = 0;
    for (const auto& p : whole->block_parameters(k)) count += static_cast<double>(p.numel());
    parameters.push_back(count);
  }
  return {
      {"2 stages balanced by parameters", pipeline::partition_min_max(parameters, 2)},
      {"3 stages by hand", pipeline::ranges_from_cuts(names, "layer3.0,decoder.0")},
      {"4 stages balanced by parameters", pipeline::partition_min_max(parameters, 4)},
      {"6 stages, one block each at both ends",
       pipeline::ranges_from_cuts(names, "layer1.0,layer1.1,decoder.0,decoder.4,head")},
  };
}

at::Tensor bce(const at::Tensor& logits, const at::Tensor& target) {
  return torch::binary_cross_entropy_with_logits(logits, target);
}

// The loss over `microbatches` pieces of the batch, each weighted by its share, and the
// parameters' gradients, in one process: what a pipelined step computes (batch norm normalises
// each micro-batch by its own statistics).
std::pair<double, std::vector<at::Tensor>> reference(const at::Tensor& x, const at::Tensor& target,
                                                     int microbatches) {
  const auto n = static_cast<int64_t>(models::unet_blocks(kDepth).size());
  models::UnetBlocks whole(kDepth, 1, 0, n, kSeed);
  double loss = 0;
  std::vector<at::Tensor> xs = x.tensor_split(microbatches), ts = target.tensor_split(microbatches);
  for (size_t m = 0; m < xs.size(); ++m) {
    double share = static_cast<double>(xs[m].size(0)) / static_cast<double>(x.size(0));
    at::Tensor part = bce(whole->forward({xs[m]}).back(), ts[m]) * share;
    part.backward();
    loss += part.item<double>();
  }
  std::vector<at::Tensor> grads;
  for (const auto& p : whole->parameters()) grads.push_back(p.grad());
  return {loss, grads};
}

TEST(UnetPartitions, AnyCutOverTwoToSixWorkersGivesTheOneProcessLossAndGradients) {
  LocalWorld world(six_deterministic_workers());
  torch::manual_seed(4);
  at::Tensor x = torch::randn({2, 3, 64, 64});
  at::Tensor target = (torch::rand({2, 1, 64, 64}) > 0.5).to(torch::kFloat);
  auto [want_loss, want] = reference(x, target, 1);
  auto [want_pipelined_loss, want_pipelined] = reference(x, target, 2);
  for (const Partition& partition : partitions()) {
    SCOPED_TRACE(partition.what);
    RemoteUnet split = RemoteUnet::create(kDepth, 1, plan_of(partition.ranges), kSeed);
    ASSERT_EQ(split.stages().size(), partition.ranges.size());
    {
      dist_autograd::Context context;
      at::Tensor loss = bce(split.forward(x, /*direct=*/true), target);
      dist_autograd::backward(context.id(), {loss});
      std::vector<at::Tensor> got = dist_autograd::get_gradients(context.id(), split.parameters());
      EXPECT_NEAR(loss.item<double>(), want_loss, 1e-5 * want_loss);
      EXPECT_LE(models::max_relative_error(got, want), 1e-5);
    }
    for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB}) {
      SCOPED_TRACE(schedule_name(schedule));
      PipelineOptions options;
      options.schedule = schedule;
      options.microbatches = 2;
      Pipeline pipe(split.modules(), options);
      dist_autograd::Context context;
      double loss = pipe.step(x, target, bce).loss;
      std::vector<at::Tensor> got = dist_autograd::get_gradients(context.id(), split.parameters());
      EXPECT_NEAR(loss, want_pipelined_loss, 1e-5 * want_pipelined_loss);
      EXPECT_LE(models::max_relative_error(got, want_pipelined), 1e-5);
    }
  }
}

TEST(UnetPartitions, APlanThatDoesNotCoverTheBlocksIsRefusedBeforeAnythingIsBuilt) {
  const auto n = static_cast<int64_t>(models::unet_blocks(kDepth).size());
  auto message = [&](std::vector<RemoteUnet::StagePlan> plan) {
    try {
      RemoteUnet::create(kDepth, 1, plan);
    } catch (const rpc::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // No world is up: a plan that got as far as building a stage would fail otherwise.
  EXPECT_EQ(message({{"a", 0, 4, "w1", ""}, {"b", 5, n, "w2", ""}}),
            "stage \"b\" has blocks [5, 15) but must start at block 4 and hold at least one of "
            "the 15 blocks");
  EXPECT_EQ(message({{"a", 0, 4, "w1", ""}, {"a", 4, n, "w2", ""}}), "two stages are named \"a\"");
  EXPECT_EQ(message({{"a", 0, 4, "w1", ""}}),
            "the stages end at block 4 of 15: the last must end with the head");
}

}  // namespace
}  // namespace ferry
