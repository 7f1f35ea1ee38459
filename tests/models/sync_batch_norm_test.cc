// The batch norm of a stage's step statistics: plain BatchNorm2d until a stage hands it the
// step's statistics; then two replicas on halves of a batch normalise, backpropagate and move
// their running statistics as one batch norm on the whole batch, and a step's micro-batches move
// the running statistics once, as their concatenation would, and a recomputation not at all.
#include "ferry/models/sync_batch_norm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "ferry/data/dataset.h"
#include "ferry/models/unet_blocks.h"
#include "ferry/remote_module/stage.h"
#include "ferry/remote_module/step_statistics.h"

namespace ferry::models {
namespace {

using ::testing::ElementsAreArray;

constexpr int64_t kChannels = 3;

// Two threads' sums meet here: each gets the sum of both. A partner that does not come within
// ten seconds is an error, not a hang.
class TwoThreadSum {
 public:
  void operator()(std::vector<at::Tensor>& tensors) {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t round = round_;
    if (waiting_.empty()) {
      waiting_ = tensors;
      if (!changed_.wait_for(lock, std::chrono::seconds(10), [&] { return round_ != round; })) {
        throw std::runtime_error("the other replica never summed");
      }
      tensors = result_;
      for (auto& t : tensors) t = t.clone();
      return;
    }
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i] = tensors[i] + waiting_[i];
    result_ = tensors;
    waiting_.clear();
    ++round_;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<at::Tensor> waiting_, result_;
  int64_t round_ = 0;
};

// Weight and bias away from 1 and 0, so that a wrong gradient through them shows.
SyncBatchNorm2d made(uint64_t seed) {
  torch::manual_seed(seed);
  SyncBatchNorm2d bn(kChannels);
  torch::NoGradGuard no_grad;
  bn->weight.uniform_(0.5, 1.5);
  bn->bias.uniform_(-0.5, 0.5);
  return bn;
}

at::Tensor batch(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn({n, kChannels, 5, 4}) * 2 + 3;
}

void expect_close(const at::Tensor& a, const at::Tensor& b, const char* what) {
  EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-5))
      << what << ": largest difference " << (a - b).abs().max().item<double>();
}

std::vector<std::string> names(const torch::nn::Module& module) {
  std::vector<std::string> out;
  for (const auto& p : module.named_parameters()) out.push_back(p.key());
  for (const auto& b : module.named_buffers()) out.push_back(b.key());
  return out;
}

TEST(SyncBatchNorm2d, UntilGivenStepStatisticsItIsBatchNorm2d) {
  SyncBatchNorm2d ours = made(1);
  torch::nn::BatchNorm2d plain(kChannels);
  EXPECT_THAT(names(*ours), ElementsAreArray(names(*plain)));
  {
    torch::NoGradGuard no_grad;
    plain->weight.copy_(ours->weight);
    plain->bias.copy_(ours->bias);
  }
  at::Tensor x = batch(4, 2);
  expect_close(ours(x), plain(x), "output");
  expect_close(ours->running_mean, plain->running_mean, "running mean");
  expect_close(ours->running_var, plain->running_var, "running variance");
}

TEST(SyncBatchNorm2d, TwoReplicasOnHalvesOfABatchAreOneBatchNormOnTheWholeBatch) {
  const at::Tensor whole = batch(8, 3);
  // A loss whose gradient differs per element, so that the backward's sums matter.
  const at::Tensor weights = batch(8, 4);
  SyncBatchNorm2d one = made(5);
  at::Tensor x = whole.clone().requires_grad_();
  at::Tensor y = one(x);
  (y * weights).sum().backward();

  TwoThreadSum sum;
  std::vector<SyncBatchNorm2d> replicas{made(5), made(5)};
  std::vector<at::Tensor> inputs(2), outputs(2);
  std::vector<std::string> failures(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        replicas[r]->take_step_statistics([&sum](std::vector<at::Tensor>& t) { sum(t); });
        inputs[r] = whole.narrow(0, 4 * r, 4).clone().requires_grad_();
        outputs[r] = replicas[r](inputs[r]);
        (outputs[r] * weights.narrow(0, 4 * r, 4)).sum().backward();
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(failures[0], "");
  ASSERT_EQ(failures[1], "");
  expect_close(at::cat({outputs[0], outputs[1]}), y, "output");
  expect_close(at::cat({inputs[0].grad(), inputs[1].grad()}), x.grad(), "input gradient");
  // Each replica's parameter gradient is its own part of the whole loss's: they add up.
  expect_close(replicas[0]->weight.grad() + replicas[1]->weight.grad(), one->weight.grad(),
               "weight gradient");
  expect_close(replicas[0]->bias.grad() + replicas[1]->bias.grad(), one->bias.grad(),
               "bias gradient");
  for (const SyncBatchNorm2d& replica : replicas) {
    expect_close(replica->running_mean, one->running_mean, "running mean");
    expect_close(replica->running_var, one->running_var, "running variance");
  }
}

TEST(SyncBatchNorm2d, AStepsMicroBatchesMoveTheRunningStatisticsOnceAsTheirConcatenation) {
  const at::Tensor whole = batch(8, 6);
  SyncBatchNorm2d one = made(7);
  one(whole);
  SyncBatchNorm2d micro = made(7);
  micro->take_step_statistics({});
  {
    remote_module::ForwardPassScope step({/*step=*/11, /*recompute=*/false});
    at::Tensor first = micro(whole.narrow(0, 0, 3));
    // The micro-batch is normalised by its own statistics, as a batch norm on it alone would.
    expect_close(
        first,
        torch::nn::functional::batch_norm(whole.narrow(0, 0, 3), at::Tensor(), at::Tensor(),
                                          torch::nn::functional::BatchNormFuncOptions()
                                              .weight(micro->weight)
                                              .bias(micro->bias)
                                              .training(true)),
        "micro-batch output");
    micro(whole.narrow(0, 3, 5));
  }
  expect_close(micro->running_mean, one->running_mean, "running mean");
  expect_close(micro->running_var, one->running_var, "running variance");
  EXPECT_EQ(micro->num_batches_tracked.item<int64_t>(), 1);

  const at::Tensor mean = micro->running_mean.clone();
  {
    remote_module::ForwardPassScope recompute({/*step=*/11, /*recompute=*/true});
    micro(whole.narrow(0, 0, 3));
  }
  EXPECT_TRUE(torch::equal(micro->running_mean, mean)) << "a recomputation moved them";

  const at::Tensor next = batch(4, 8);
  one(next);
  {
    remote_module::ForwardPassScope step({/*step=*/12, /*recompute=*/false});
    micro(next);
  }
  expect_close(micro->running_mean, one->running_mean, "running mean after the next step");
  expect_close(micro->running_var, one->running_var, "running variance after the next step");
  EXPECT_EQ(micro->num_batches_tracked.item<int64_t>(), 2);
}

// A whole U-Net on a synthetic batch, each replica on every other image: the replicas' averaged
// gradients are as close to float64's on the whole batch as float32's own on it. (Statistics
// summed as sums of squares lost a tenth of a percent here: the means of some channels are far
// larger than their deviations.)
TEST(SyncBatchNorm2d, TwoReplicasOfAUnetAreAsPreciseAsOneOnTheWholeBatch) {
  auto set = std::make_shared<data::SyntheticDataset>(10, 32, 5);
  data::BatchLoader loader(set, data::split_indices(10, 0.2).first, 8, 5, /*drop_last=*/true);
  loader.start_epoch(0);
  std::optional<data::Batch> batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  auto unet = [](at::ScalarType dtype) {
    auto blocks = std::make_shared<UnetBlocksImpl>(18, 1, 0, unet_blocks(18).size(), 5, 3);
    blocks->to(dtype);
    return blocks;
  };
  auto train = [](UnetBlocksImpl& blocks, const at::Tensor& images, const at::Tensor& masks) {
    at::Tensor logits = blocks.forward({images.to(blocks.parameters()[0].scalar_type())}).back();
    torch::binary_cross_entropy_with_logits(logits, masks.to(logits.scalar_type())).backward();
  };
  auto exact = unet(at::kDouble);
  train(*exact, batch->images, batch->masks);
  auto one = unet(at::kFloat);
  train(*one, batch->images, batch->masks);

  TwoThreadSum sum;
  std::vector<std::shared_ptr<UnetBlocksImpl>> replicas{unet(at::kFloat), unet(at::kFloat)};
  std::vector<std::string> failures(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        remote_module::ModuleStage(replicas[r], {})
            .take_step_statistics([&sum](std::vector<at::Tensor>& t) { sum(t); });
        const at::Tensor mine = torch::arange(r, 8, 2);
        train(*replicas[r], batch->images.index_select(0, mine),
              batch->masks.index_select(0, mine));
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(failures[0], "");
  ASSERT_EQ(failures[1], "");
  auto one_params = one->named_parameters();
  auto first = replicas[0]->named_parameters();
  auto second = replicas[1]->named_parameters();
  double worst_one = 0, worst_replicas = 0;
  std::string worst_name;
  for (const auto& item : exact->named_parameters()) {
    const at::Tensor& truth = item.value().grad();
    auto error = [&](const at::Tensor& g) {
      return ((g.to(at::kDouble) - truth).norm() / truth.norm()).item<double>();
    };
    const std::string& name = item.key();
    worst_one = std::max(worst_one, error(one_params[name].grad()));
    const double e = error((first[name].grad() + second[name].grad()) / 2);
    if (e > worst_replicas) {
      worst_replicas = e;
      worst_name = name;
    }
  }
  EXPECT_LT(worst_replicas, std::max(3 * worst_one, 1e-5))
      << worst_name << ": replicas " << worst_replicas << ", one batch norm " << worst_one;
}

}  // namespace
}  // namespace ferry::models
