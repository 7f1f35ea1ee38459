// The U-Net cut at any block boundaries over 2 to 6 workers (balanced, by hand, one block per
// stage at the ends) computes the one-process model's loss and gradients, in plain steps with
// activations going stage to stage and in pipelined steps. Every partition of one seed starts
// from the same weights, so the reference is the whole block list built here.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "ferry/dist_autograd/context.h"
#include "ferry/models/compare.h"
#include "ferry/models/remote_unet.h"
#include "ferry/models/unet_blocks.h"
#include "ferry/pipeline/partition.h"
#include "ferry/pipeline/pipeline.h"
#include "tests/support/cluster.h"

namespace ferry::pipeline {
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
    for (bool direct : {true, false}) {
      SCOPED_TRACE(direct ? "stage to stage" : "through the master");
      dist_autograd::Context context;
      at::Tensor loss = bce(split.forward(x, direct), target);
      dist_autograd::backward(context.id(), {loss});
      std::vector<at::Tensor> got = dist_autograd::get_gradients(context.id(), split.parameters());
      EXPECT_NEAR(loss.item<double>(), want_loss, 1e-5 * want_loss);
      EXPECT_LE(models::max_relative_error(got, want), 1e-5);
    }
    for (auto [schedule, recompute] :
         {std::pair{Schedule::GPipe, false}, std::pair{Schedule::OneFOneB, false},
          std::pair{Schedule::OneFOneB, true}, std::pair{Schedule::ZeroBubble, false},
          std::pair{Schedule::ZeroBubble, true}}) {
      SCOPED_TRACE(fmt::format("{}{}", schedule_name(schedule), recompute ? ", recomputed" : ""));
      PipelineOptions options;
      options.schedule = schedule;
      options.microbatches = 2;
      options.routes = split.routes();
      if (recompute) {
        for (size_t k = 0; k < split.stages().size(); ++k) {
          options.checkpoint_stages.push_back(static_cast<int>(k));
        }
      }
      Pipeline pipe(split.modules(), options);
      dist_autograd::Context context;
      double loss = pipe.step(x, target, bce).loss;
      std::vector<at::Tensor> got = dist_autograd::get_gradients(context.id(), split.parameters());
      EXPECT_NEAR(loss, want_pipelined_loss, 1e-5 * want_pipelined_loss);
      EXPECT_LE(models::max_relative_error(got, want_pipelined), 1e-5);
    }
  }
}

// Stem | layer1.0 | layer1.1..layer4.1 | decoder.0..decoder.3 | decoder.4 | head.
std::vector<RemoteUnet::StagePlan> six_stages() {
  std::vector<std::string> names;
  for (const auto& b : models::unet_blocks(kDepth)) names.push_back(b.name);
  return plan_of(pipeline::ranges_from_cuts(names, "layer1.0,layer1.1,decoder.0,decoder.4,head"));
}

TEST(UnetPartitions, EachSkipIsRoutedStraightToTheStageThatUsesIt) {
  // layer1.0 keeps the stem's output as the skip decoder.3 uses: it goes from stage 1 to stage 3,
  // past stage 2, which takes only the activation and gives the four deeper features to stage 3.
  const remote_module::Routes want = {{{1, 0}}, {{3, 0}, {2, 0}}, {{3, 1}, {3, 2}, {3, 3}, {3, 4}},
                                      {{4, 0}}, {{5, 0}},         {}};
  EXPECT_EQ(RemoteUnet::routes_of(kDepth, six_stages()), want);
  // Cut at the three seams, every skip goes to the next stage anyway.
  const remote_module::Routes seams = {{{1, 0}, {1, 1}, {1, 2}, {1, 3}, {1, 4}}, {{2, 0}}, {}};
  EXPECT_EQ(RemoteUnet::routes_of(kDepth, RemoteUnet::seams(kDepth, {"a", "b", "c"})), seams);
}

std::int64_t bytes_of(const std::vector<at::Tensor>& tensors, size_t from = 0) {
  std::int64_t n = 0;
  for (size_t i = from; i < tensors.size(); ++i)
    n += static_cast<std::int64_t>(tensors[i].nbytes());
  return n;
}

// What each worker of a plain step sends, counted on the wire: a stage's output goes out once,
// whichever stage it is for, and so does the gradient of each of its inputs. A skip relayed
// through stage 2 would add the stem's feature and its gradient (1 MiB) to worker w3's bytes.
TEST(UnetPartitions, ASkipFeatureCrossesTheNetworkOnce) {
  LocalWorld world(six_deterministic_workers());
  const std::vector<RemoteUnet::StagePlan> plan = six_stages();
  RemoteUnet split = RemoteUnet::create(kDepth, 1, plan, kSeed);
  torch::manual_seed(4);
  at::Tensor x = torch::randn({2, 3, 64, 64});
  at::Tensor target = (torch::rand({2, 1, 64, 64}) > 0.5).to(torch::kFloat);

  // Each stage's output and the gradients of its inputs are the part of the carry above what it
  // leaves untouched. The logits come back through every stage of the chain, and their gradient
  // goes forward through it, so each but the last sends them twice more.
  const std::vector<models::UnetBlock> blocks = models::unet_blocks(kDepth);
  std::vector<std::int64_t> want(plan.size(), 0);
  std::vector<at::Tensor> carry{x};
  {
    torch::NoGradGuard no_grad;
    for (size_t s = 0; s < plan.size(); ++s) {
      const auto low =
          static_cast<size_t>(models::unet_carry_untouched(blocks, plan[s].first, plan[s].last));
      if (s > 0) want[s] += bytes_of(carry, low);
      carry = models::UnetBlocks(kDepth, 1, plan[s].first, plan[s].last, kSeed)->forward(carry);
      want[s] += bytes_of(carry, low);
    }
  }
  for (size_t s = 0; s + 1 < plan.size(); ++s) want[s] += 2 * bytes_of(carry);
  const std::int64_t skip = 2 * 64 * 32 * 32 * static_cast<std::int64_t>(sizeof(float));

  auto sent = [&] {
    std::vector<std::int64_t> out;
    for (const auto& stage : plan) out.push_back(rpc::rpc_sync(stage.worker, "bytes_sent").toInt());
    return out;
  };
  std::vector<std::int64_t> before = sent();
  {
    dist_autograd::Context context;
    at::Tensor loss = bce(split.forward(x, /*direct=*/true), target);
    dist_autograd::backward(context.id(), {loss});
  }
  std::vector<std::int64_t> after = sent();
  for (size_t s = 0; s < plan.size(); ++s) {
    SCOPED_TRACE(plan[s].worker);
    const std::int64_t got = after[s] - before[s];
    // Beyond the tensors: frames, envelopes and the context's release, a few KiB.
    EXPECT_GE(got, want[s]);
    EXPECT_LT(got, want[s] + skip / 8);
    EXPECT_EQ(rpc::rpc_sync(plan[s].worker, "ferry.portal.waiting").toInt(), 0);
  }
}

TEST(UnetPartitions, APlanThatDoesNotCoverTheBlocksIsRefusedBeforeAnythingIsBuilt) {
  const auto n = static_cast<int64_t>(models::unet_blocks(kDepth).size());
  auto message = [&](std::vector<RemoteUnet::StagePlan> plan) {
    try {
      RemoteUnet::create(kDepth, 1, plan);
    } catch (const std::invalid_argument& e) {
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
}  // namespace ferry::pipeline
