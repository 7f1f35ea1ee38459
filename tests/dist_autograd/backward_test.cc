// Distributed backward across real worker processes: hops, fan-out, fan-in, concurrent contexts,
// failures, release, and the U-Net split over three workers against the same model in one process.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <csignal>
#include <thread>

#include "ferry/dist_autograd/context.h"
#include "ferry/dist_autograd/optimizer.h"
#include "ferry/models/compare.h"
#include "ferry/models/remote_unet.h"
#include "ferry/remote_module/remote_module.h"
#include "tests/support/cluster.h"
#include "tests/support/error_of.h"
#include "tests/support/test_stages.h"
#include "tests/support/wait.h"

namespace ferry::dist_autograd {
namespace {

using ferry::testing::error_of;
using ferry::testing::kind_and_error_of;
using ::testing::HasSubstr;

using testing::LocalWorld;

LocalWorld::Settings three_workers() {
  LocalWorld::Settings settings;
  settings.peer_names = {"a", "b", "c"};
  return settings;
}

at::Tensor leaf(std::vector<float> values) { return torch::tensor(values).requires_grad_(true); }

at::Tensor call(const std::string& to, const std::string& function, std::vector<c10::IValue> args) {
  return rpc::rpc_sync(to, function, std::move(args)).toTensor();
}

at::Tensor gradient_of(const Context& context, const at::Tensor& x) {
  auto grads = get_gradients(context.id());
  auto it = grads.find(x);
  return it == grads.end() ? at::Tensor() : it->value();
}

TEST(DistBackward, OneHopGradientLandsInTheContextNotInGrad) {
  LocalWorld world(three_workers());
  at::Tensor x = leaf({1, 2, 3});
  Context context;
  at::Tensor y = call("a", "double_it", {x});
  backward(context.id(), {(y * y).sum()});
  // loss = sum(4 x^2)
  EXPECT_TRUE(torch::equal(gradient_of(context, x), 8 * x.detach()));
  EXPECT_FALSE(x.grad().defined());
}

TEST(DistBackward, NestedHopsThroughThreeWorkers) {
  LocalWorld world(three_workers());
  at::Tensor x = leaf({1, -1});
  Context context;
  // master -> a -> b -> c, each doubling.
  at::Tensor y = call("a", "chain", {std::vector<std::string>{"b", "c"}, x});
  ASSERT_TRUE(torch::equal(y.detach(), 8 * x.detach()));
  backward(context.id(), {y.sum()});
  EXPECT_TRUE(torch::equal(gradient_of(context, x), torch::full({2}, 8.0f)));
}

TEST(DistBackward, FanOutSumsGradientsFromTwoWorkers) {
  LocalWorld world(three_workers());
  at::Tensor x = leaf({1, 2});
  Context context;
  // h is not a leaf: its backward runs once per worker that sent a gradient back.
  at::Tensor h = x * 1.5;
  at::Tensor y1 = call("a", "double_it", {h});
  at::Tensor y2 = call("b", "double_it", {h});
  backward(context.id(), {(y1 * y2).sum()});
  // loss = sum(4 h^2) = sum(9 x^2)
  EXPECT_TRUE(torch::allclose(gradient_of(context, x), 18 * x.detach()));
}

TEST(DistBackward, FanInCombinesResultsOfTwoWorkersOnAThird) {
  LocalWorld world(three_workers());
  at::Tensor x = leaf({1, 3});
  Context context;
  at::Tensor a = call("a", "double_it", {x});
  at::Tensor b = call("b", "double_it", {x});
  at::Tensor z = call("c", "add", {a, b});
  backward(context.id(), {(z * z).sum()});
  // z = 4x, loss = sum(16 x^2)
  EXPECT_TRUE(torch::allclose(gradient_of(context, x), 32 * x.detach()));
}

// "b"'s output reaches the loss through two calls, so "b"'s part runs once per gradient message
// and sends its own gradients once per run, through this process on to "a". Those messages must
// not claim to be the last: "a" would free its graph (its Linear keeps its input) after the
// first and fail on the second.
TEST(DistBackward, APartThatRunsTwiceKeepsTheGraphOfThePartsBeforeIt) {
  LocalWorld world(three_workers());
  const remote_module::StageConfig first_config = testing::mlp_config(3, 4, 3, 1);
  const remote_module::StageConfig second_config = testing::mlp_config(3, 4, 3, 2);
  remote_module::RemoteModule first =
      remote_module::RemoteModule::create("a", "test.mlp", first_config);
  remote_module::RemoteModule second =
      remote_module::RemoteModule::create("b", "test.mlp", second_config);
  torch::manual_seed(3);
  at::Tensor x = torch::randn({2, 3});
  Context context;
  at::Tensor u = second.forward({first.forward({x})}).toTensor();
  at::Tensor v1 = call("c", "double_it", {u});
  at::Tensor v2 = call("c", "double_it", {u});
  backward(context.id(), {(v1 * v2).sum()});
  std::vector<at::Tensor> got = get_gradients(context.id(), first.remote_parameters());

  std::unique_ptr<remote_module::Stage> local_first =
      remote_module::make_stage("test.mlp", first_config);
  std::unique_ptr<remote_module::Stage> local_second =
      remote_module::make_stage("test.mlp", second_config);
  at::Tensor local_u = local_second->forward({local_first->forward({x})}).toTensor();
  (4 * local_u * local_u).sum().backward();
  std::vector<at::Tensor> want;
  for (auto& [name, p] : local_first->named_parameters()) want.push_back(p.grad());
  EXPECT_LE(models::max_relative_error(got, want), 1e-5);
}

TEST(DistBackward, SkipConnectionsThroughAListOfFeatures) {
  LocalWorld world(three_workers());
  remote_module::StageConfig config = remote_module::stage_config();
  config.insert("channels", 2);
  remote_module::RemoteModule pyramid =
      remote_module::RemoteModule::create("a", "test.pyramid", config);
  torch::manual_seed(3);
  at::Tensor x = torch::randn({1, 2, 4, 4}).requires_grad_(true);
  Context context;
  // Three feature maps come back in one list; each is used again on another worker.
  auto features = pyramid.forward({x}).toTensorVector();
  ASSERT_EQ(features.size(), 3u);
  at::Tensor loss = call("b", "double_it", {features[0]}).sum() +
                    call("c", "double_it", {features[2]}).sum() + features[1].sum();
  backward(context.id(), {loss});
  auto remote_grads = get_gradients(context.id(), pyramid.remote_parameters());

  // The same on a local copy of the stage.
  auto local = testing::make_local_stage("test.pyramid", config, pyramid.state_dict());
  at::Tensor lx = x.detach().requires_grad_(true);
  auto lf = local->forward({lx}).toTensorVector();
  (2 * lf[0].sum() + 2 * lf[2].sum() + lf[1].sum()).backward();
  auto params = local->named_parameters();
  ASSERT_EQ(params.size(), remote_grads.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(remote_grads[i], params[i].second.grad(), 1e-5, 1e-6))
        << params[i].first;
  }
  EXPECT_TRUE(torch::allclose(gradient_of(context, x), lx.grad(), 1e-5, 1e-6));
}

TEST(DistBackward, TwoContextsFromTwoThreadsStayApart) {
  LocalWorld world(three_workers());
  auto run = [](const std::string& worker, float scale, std::string* failure) {
    for (int step = 0; step < 20; ++step) {
      at::Tensor x = leaf({scale, 2 * scale});
      Context context;
      at::Tensor y = call(worker, "chain", {std::vector<std::string>{"c"}, x});
      backward(context.id(), {(y * x).sum()});
      // loss = sum(4 x^2): 8x
      at::Tensor g = gradient_of(context, x);
      if (!g.defined() || !torch::allclose(g, 8 * x.detach())) {
        *failure = "wrong gradient at step " + std::to_string(step);
        return;
      }
    }
  };
  std::string failure_a, failure_b;
  std::thread first(run, "a", 1.0f, &failure_a);
  std::thread second(run, "b", -3.0f, &failure_b);
  first.join();
  second.join();
  EXPECT_EQ(failure_a, "");
  EXPECT_EQ(failure_b, "");
}

TEST(DistBackward, OneContextPerThread) {
  LocalWorld world(three_workers());
  Context context;
  EXPECT_THAT(kind_and_error_of([] { Context(); }),
              HasSubstr(fmt::format("this thread already has autograd context {}", context.id())));
  EXPECT_EQ(current_context_id(), context.id());
}

TEST(DistBackward, WorkerThrowingInBackwardIsNamed) {
  LocalWorld world(three_workers());
  at::Tensor x = leaf({1, 2});
  {
    Context context;
    at::Tensor y = call("a", "chain", {std::vector<std::string>{}, x});
    at::Tensor z = call("b", "fail_backward", {y});
    try {
      backward(context.id(), {z.sum()});
      FAIL() << "backward did not fail";
    } catch (const rpc::Error& e) {
      EXPECT_NE(std::string(e.what()).find("on worker \"b\""), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("injected backward failure"), std::string::npos)
          << e.what();
    }
  }
  // Nothing is left behind, and the next step works.
  EXPECT_EQ(context_count(), 0u);
  for (const char* worker : {"a", "b"}) EXPECT_EQ(context_count(worker), 0) << worker;
  Context context;
  at::Tensor y = call("b", "double_it", {x});
  backward(context.id(), {y.sum()});
  EXPECT_TRUE(torch::equal(gradient_of(context, x), torch::full({2}, 2.0f)));
}

TEST(DistBackward, WorkerKilledDuringBackwardFailsPromptlyAndIsNamed) {
  LocalWorld world(three_workers());
  at::Tensor x = leaf({1, 2});
  Context context;
  // c's part of backward sleeps long enough to be killed in the middle of it.
  at::Tensor y = call("a", "double_it", {x});
  at::Tensor z = call("c", "slow_backward", {y, testing::scaled(std::chrono::seconds(60)).count()});
  // Killed once c says its part has started.
  std::thread killer([&world] {
    testing::wait_until([] { return rpc::rpc_sync("c", "sleeping", {}).toInt() > 0; },
                        std::chrono::seconds(30));
    world.peer(2).kill(SIGKILL);
  });
  auto start = std::chrono::steady_clock::now();
  try {
    backward(context.id(), {z.sum()});
    ADD_FAILURE() << "backward did not fail";
  } catch (const rpc::Error& e) {
    EXPECT_EQ(e.kind(), rpc::ErrorKind::PeerDied) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"c\""), std::string::npos) << e.what();
  }
  killer.join();
  // Long before c's part could have ended by itself.
  EXPECT_LT(std::chrono::steady_clock::now() - start, testing::scaled(std::chrono::seconds(40)));
}

TEST(DistBackward, LocalBackwardThroughAReceivedTensorPointsToDistBackward) {
  LocalWorld world(three_workers());
  at::Tensor x = leaf({1});
  Context context;
  at::Tensor y = call("a", "double_it", {x});
  try {
    y.sum().backward();
    FAIL() << "local backward went through";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("dist_autograd::backward"), std::string::npos) << e.what();
  }
}

TEST(DistBackward, ReleaseLeavesNothingBehindAfter1000Steps) {
  LocalWorld world(three_workers());
  at::Tensor x = leaf({1, 2, 3});
  for (int step = 0; step < 1000; ++step) {
    Context context;
    at::Tensor y = call("a", "chain", {std::vector<std::string>{"b"}, x});
    backward(context.id(), {y.sum()});
  }
  EXPECT_EQ(context_count(), 0u);
  for (const char* worker : {"a", "b", "c"}) EXPECT_EQ(context_count(worker), 0) << worker;
}

// ---- the U-Net split over three workers -------------------------------------------------------

// One intra-op thread in every process, so that the split and the one-process model add their
// floats in the same order. With two threads per process the reductions inside convolutions are
// split differently (gradients differ by ~2e-6 relative), and batch norm over a batch of two
// amplifies that through SGD steps; that is arithmetic, not distributed autograd.
LocalWorld::Settings deterministic_three_workers() {
  at::set_num_threads(1);
  LocalWorld::Settings settings = three_workers();
  settings.env["OMP_NUM_THREADS"] = "1";
  return settings;
}

models::RemoteUnet split_unet(int64_t depth) {
  return models::RemoteUnet::create(depth, 1, {"a", "b", "c"}, /*seed=*/1);
}

// Two 64 x 64 images and their masks, drawn from `seed`.
struct UnetBatch {
  at::Tensor x, target;
  explicit UnetBatch(uint64_t seed) {
    torch::manual_seed(seed);
    x = torch::randn({2, 3, 64, 64});
    target = (torch::rand({2, 1, 64, 64}) > 0.5).to(torch::kFloat);
  }
};

TEST(DistBackward, UnetGradientsAcrossThreeWorkersEqualOneProcess) {
  LocalWorld world(deterministic_three_workers());
  models::RemoteUnet split = split_unet(34);
  models::Unet local = split.local_copy();
  const UnetBatch batch(7);
  const at::Tensor &x = batch.x, &target = batch.target;

  Context context;
  at::Tensor loss = torch::binary_cross_entropy_with_logits(split.forward(x), target);
  backward(context.id(), {loss});
  std::vector<at::Tensor> grads = get_gradients(context.id(), split.parameters());

  at::Tensor local_loss = torch::binary_cross_entropy_with_logits(local->forward(x), target);
  local_loss.backward();
  EXPECT_NEAR(loss.item<double>(), local_loss.item<double>(), 1e-6);
  auto params = local->named_parameters(true);
  ASSERT_EQ(grads.size(), params.size());
  double worst = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    ASSERT_TRUE(grads[i].defined()) << params[i].key();
    worst = std::max(worst, models::max_relative_error(grads[i], params[i].value().grad()));
  }
  EXPECT_LE(worst, 1e-5);
  std::cout << "max relative gradient error: " << worst << "\n";
}

// Activations go from worker to worker: this process sends the images and receives the logits,
// and the gradients still equal one process's.
TEST(DistBackward, UnetStageToStageChainEqualsOneProcessAndSkipsThisProcess) {
  LocalWorld world(deterministic_three_workers());
  models::RemoteUnet split = split_unet(18);
  models::Unet local = split.local_copy();
  const UnetBatch batch(9);
  const at::Tensor &x = batch.x, &target = batch.target;

  auto measure_sent = [&](bool direct, std::vector<at::Tensor>* grads) {
    Context context;
    std::uint64_t before = rpc::agent().bytes_sent();
    at::Tensor loss = torch::binary_cross_entropy_with_logits(split.forward(x, direct), target);
    std::uint64_t sent = rpc::agent().bytes_sent() - before;
    backward(context.id(), {loss});
    *grads = get_gradients(context.id(), split.parameters());
    return sent;
  };
  std::vector<at::Tensor> direct_grads, through_grads;
  std::uint64_t direct_sent = measure_sent(true, &direct_grads);
  std::uint64_t through_sent = measure_sent(false, &through_grads);

  torch::binary_cross_entropy_with_logits(local->forward(x), target).backward();
  std::vector<at::Tensor> want;
  for (const auto& p : local->parameters()) want.push_back(p.grad());
  EXPECT_LE(models::max_relative_error(direct_grads, want), 1e-5);
  EXPECT_LE(models::max_relative_error(through_grads, want), 1e-5);

  // Through the master, it sends the encoder's five features, 2 x (64x32x32 + 64x16x16 +
  // 128x8x8 + 256x4x4 + 512x2x2) floats = 0.77 MB, and the decoder's output, 0.52 MB. The
  // images are 98 KB.
  std::uint64_t images = x.numel() * sizeof(float);
  std::cout << "sent by the master in forward: direct " << direct_sent << " bytes, through it "
            << through_sent << " bytes (images " << images << ")\n";
  EXPECT_LT(direct_sent, images + 16 * 1024);
  EXPECT_GT(through_sent, images + 800 * 1024);
}

// The loss on the last stage's worker (RemoteUnet::loss): the logits stay there, only the loss
// comes back, and the loss and gradients equal one process's.
TEST(DistBackward, AChainsLossOnItsLastWorkerEqualsOneProcessAndOnlyTheLossComesBack) {
  LocalWorld world(deterministic_three_workers());
  models::RemoteUnet split = split_unet(18);
  models::Unet local = split.local_copy();
  const UnetBatch batch(9);
  const at::Tensor &x = batch.x, &target = batch.target;
  {
    Context context;
    std::uint64_t received = rpc::agent().bytes_received();
    at::Tensor loss = split.loss(x, target, "bce");
    received = rpc::agent().bytes_received() - received;
    backward(context.id(), {loss});
    std::vector<at::Tensor> grads = get_gradients(context.id(), split.parameters());
    at::Tensor local_loss = torch::binary_cross_entropy_with_logits(local->forward(x), target);
    local_loss.backward();
    EXPECT_NEAR(loss.item<double>(), local_loss.item<double>(), 1e-6);
    std::vector<at::Tensor> want;
    for (const auto& p : local->parameters()) want.push_back(p.grad());
    EXPECT_LE(models::max_relative_error(grads, want), 1e-5);
    // The logits would be 2 x 64 x 64 floats (32 KiB); the loss is one.
    EXPECT_LT(received, 8u << 10) << received;
  }
  Context context;
  const std::string unknown = error_of([&] { split.loss(x, target, "lovasz"); });
  EXPECT_NE(unknown.find("unknown loss \"lovasz\" on worker \"c\""), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("registered: bce, bce+dice, ce, ce+dice, dice, focal, mse"),
            std::string::npos)
      << unknown;
}

TEST(DistBackward, AFailingStageInAChainIsNamed) {
  LocalWorld world(three_workers());
  remote_module::StageConfig encoder = remote_module::stage_config();
  encoder.insert("depth", int64_t{18});
  std::vector<remote_module::RemoteModule> chain = {
      remote_module::RemoteModule::create("a", "unet.encoder", encoder),
      remote_module::RemoteModule::create("b", "unet.head", remote_module::stage_config())};
  Context context;
  try {
    remote_module::RemoteModule::forward_chain(chain, {torch::randn({2, 3, 64, 64})});
    FAIL() << "a head fed the encoder's list of features should fail";
  } catch (const rpc::Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("stage \"unet.head\" on worker \"b\""), std::string::npos) << what;
    EXPECT_NE(what.find("takes one tensor"), std::string::npos) << what;
  }
}

// A stage's part of the graph is reached by no other part, so it frees what autograd saved as
// its backward runs: after backward only the context's gradients are left on the worker, not
// the step's activations. A backward that retains the graph keeps them, and may run again.
TEST(DistBackward, AStageFreesItsActivationsOnceItsBackwardRanUnlessTheGraphIsRetained) {
  LocalWorld world(three_workers());
  models::RemoteUnet split = split_unet(18);
  const remote_module::RemoteModule& encoder = split.stages().front().module;
  ASSERT_EQ(encoder.worker(), "a");
  auto live = [] { return rpc::rpc_sync("a", "tensor_live_bytes", {}).toInt(); };
  const int64_t gradient_bytes = encoder.parameter_bytes();
  torch::manual_seed(3);
  at::Tensor x = torch::randn({8, 3, 64, 64});
  at::Tensor target = (torch::rand({8, 1, 64, 64}) > 0.5).to(torch::kFloat);
  std::vector<at::Tensor> once;
  {
    Context context;
    const int64_t before = live();
    at::Tensor loss = torch::binary_cross_entropy_with_logits(split.forward(x, true), target);
    const int64_t activations = live() - before;
    backward(context.id(), {loss});
    const int64_t left = live() - before - gradient_bytes;
    std::cout << "encoder's worker: " << activations / 1048576.0 << " MiB after forward, "
              << left / 1048576.0 << " MiB besides the gradients after backward\n";
    EXPECT_GT(activations, 8 << 20);
    // What stays (about the size of the stage's output carry here) is released with the context.
    EXPECT_LT(left, activations / 3);
    once = get_gradients(context.id(), split.parameters());
  }
  Context context;
  const int64_t before = live();
  at::Tensor loss = torch::binary_cross_entropy_with_logits(split.forward(x, true), target);
  const int64_t activations = live() - before;
  backward(context.id(), {loss}, /*retain_graph=*/true);
  EXPECT_GT(live() - before - gradient_bytes, activations / 2);
  backward(context.id(), {loss});
  std::vector<at::Tensor> twice = get_gradients(context.id(), split.parameters());
  for (auto& g : once) g = g * 2;
  EXPECT_LE(models::max_relative_error(twice, once), 1e-5);
}

TEST(DistBackward, UnetFiveSgdStepsAcrossThreeWorkersEqualOneProcess) {
  LocalWorld world(deterministic_three_workers());
  models::RemoteUnet split = split_unet(18);
  models::Unet local = split.local_copy();
  DistributedOptimizer optimizer(OptimizerSpec::sgd(0.05, 0.9, 1e-4), split.parameters());
  torch::optim::SGD local_optimizer(
      local->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
  torch::manual_seed(11);
  for (int step = 0; step < 5; ++step) {
    at::Tensor x = torch::randn({2, 3, 64, 64});
    at::Tensor target = (torch::rand({2, 1, 64, 64}) > 0.5).to(torch::kFloat);
    {
      Context context;
      backward(context.id(), {torch::binary_cross_entropy_with_logits(split.forward(x), target)});
      optimizer.step(context.id());
    }
    local_optimizer.zero_grad();
    torch::binary_cross_entropy_with_logits(local->forward(x), target).backward();
    local_optimizer.step();
  }
  models::Unet after = split.local_copy();
  auto got = after->named_parameters(true);
  auto want = local->named_parameters(true);
  double worst = 0;
  for (const auto& entry : want) {
    worst = std::max(worst, models::max_relative_error(*got.find(entry.key()), entry.value()));
  }
  EXPECT_LE(worst, 1e-4);
  std::cout << "max relative parameter error after 5 steps: " << worst << "\n";
  for (const auto& entry : local->named_buffers(true)) {
    if (entry.key().find("num_batches_tracked") != std::string::npos) continue;
    EXPECT_LE(
        models::max_relative_error(*after->named_buffers(true).find(entry.key()), entry.value()),
        1e-4)
        << entry.key();
  }
}

}  // namespace
}  // namespace ferry::dist_autograd
