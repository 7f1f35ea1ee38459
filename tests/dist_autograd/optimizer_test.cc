// DistributedOptimizer against torch::optim in one process, its errors, and its state in a
// checkpoint.
#include "ferry/dist_autograd/optimizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <thread>

#include "ferry/dist_autograd/context.h"
#include "ferry/remote_module/checkpoint.h"
#include "ferry/remote_module/remote_module.h"
#include "ferry/remote_module/state_handover.h"
#include "tests/support/cluster.h"
#include "tests/support/error_of.h"
#include "tests/support/test_stages.h"

namespace ferry::dist_autograd {
namespace {

using ferry::testing::kind_and_error_of;

using testing::error_of;
using ::testing::HasSubstr;
using testing::LocalWorld;
using testing::mlp_config;

LocalWorld::Settings two_workers() {
  LocalWorld::Settings settings;
  settings.peer_names = {"a", "b"};
  return settings;
}

// Two MLP stages on two workers, chained.
struct TwoStages {
  static remote_module::StageConfig first_config() { return mlp_config(4, 8, 2, 5); }
  static remote_module::StageConfig second_config() { return mlp_config(2, 6, 1, 6); }

  explicit TwoStages(const std::string& first_worker = "a", const std::string& second_worker = "b",
                     const remote_module::StageConfig& first_stage = first_config(),
                     const remote_module::StageConfig& second_stage = second_config())
      : first(remote_module::RemoteModule::create(first_worker, "test.mlp", first_stage)),
        second(remote_module::RemoteModule::create(second_worker, "test.mlp", second_stage)) {}

  remote_module::RemoteModule first;
  remote_module::RemoteModule second;

  std::vector<rpc::RRefPtr> parameters() const {
    auto all = first.remote_parameters();
    for (auto& p : second.remote_parameters()) all.push_back(p);
    return all;
  }
  void train_step(DistributedOptimizer& optimizer, const at::Tensor& x) const {
    Context context;
    at::Tensor y = second.forward({first.forward({x})}).toTensor();
    backward(context.id(), {(y * y).mean()});
    optimizer.step(context.id());
  }
};

at::Tensor batch(int step) {
  torch::manual_seed(100 + step);
  return torch::randn({3, 4});
}

void expect_same_parameters(const remote_module::RemoteModule& a,
                            const remote_module::RemoteModule& b, double tolerance) {
  auto sa = a.state_dict();
  auto sb = b.state_dict();
  for (const auto& entry : sa) {
    EXPECT_TRUE(torch::allclose(entry.value(), sb.at(entry.key()), tolerance, tolerance * 1e-2))
        << entry.key();
  }
}

class OptimizerKinds : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimizerKinds, ThreeStepsEqualTorchOptimInOneProcess) {
  LocalWorld world(two_workers());
  TwoStages stages;
  auto local_first =
      testing::make_local_stage("test.mlp", TwoStages::first_config(), stages.first.state_dict());
  auto local_second =
      testing::make_local_stage("test.mlp", TwoStages::second_config(), stages.second.state_dict());
  std::vector<at::Tensor> local_params;
  for (auto* stage : {local_first.get(), local_second.get()}) {
    for (auto& [name, p] : stage->named_parameters()) local_params.push_back(p);
  }
  std::unique_ptr<torch::optim::Optimizer> local;
  OptimizerSpec spec;
  if (GetParam() == "sgd") {
    spec = OptimizerSpec::sgd(0.1, 0.9, 1e-3);
    local = std::make_unique<torch::optim::SGD>(
        local_params, torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3));
  } else if (GetParam() == "adam") {
    spec = OptimizerSpec::adam(0.01, 1e-3);
    local = std::make_unique<torch::optim::Adam>(
        local_params, torch::optim::AdamOptions(0.01).weight_decay(1e-3));
  } else {
    spec = OptimizerSpec::adamw(0.01, 0.05);
    local = std::make_unique<torch::optim::AdamW>(
        local_params, torch::optim::AdamWOptions(0.01).weight_decay(0.05));
  }
  DistributedOptimizer optimizer(spec, stages.parameters());
  EXPECT_EQ(optimizer.owners(), (std::vector<std::string>{"a", "b"}));
  for (int step = 0; step < 3; ++step) {
    stages.train_step(optimizer, batch(step));
    local->zero_grad();
    at::Tensor y = local_second->forward({local_first->forward({batch(step)})}).toTensor();
    (y * y).mean().backward();
    local->step();
  }
  size_t i = 0;
  for (const remote_module::RemoteModule* stage : {&stages.first, &stages.second}) {
    for (const auto& entry : stage->state_dict()) {
      ASSERT_LT(i, local_params.size());
      EXPECT_TRUE(torch::allclose(entry.value(), local_params[i], 1e-5, 1e-7)) << entry.key();
      ++i;
    }
  }
  // The context keeps the gradients; `.grad` on the workers stays empty.
  EXPECT_EQ(i, local_params.size());
}

INSTANTIATE_TEST_SUITE_P(Builtin, OptimizerKinds, ::testing::Values("sgd", "adam", "adamw"));

TEST(DistributedOptimizer, UnknownOptimizerNamesTheWorkerAndTheKnownOnes) {
  LocalWorld world(two_workers());
  TwoStages stages;
  try {
    DistributedOptimizer optimizer({"lbfgs-typo", {{"lr", 1.0}}}, stages.parameters());
    FAIL() << "built an unknown optimizer";
  } catch (const rpc::Error& e) {
    std::string text = e.what();
    EXPECT_NE(text.find("worker \"a\""), std::string::npos) << text;
    EXPECT_NE(text.find("known: adam, adamw, sgd"), std::string::npos) << text;
  }
}

TEST(DistributedOptimizer, UnknownOptionIsNamed) {
  LocalWorld world(two_workers());
  TwoStages stages;
  try {
    DistributedOptimizer optimizer({"sgd", {{"lr", 1.0}, {"momentun", 0.9}}}, stages.parameters());
    FAIL() << "accepted a misspelt option";
  } catch (const rpc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no option \"momentun\""), std::string::npos) << e.what();
  }
}

TEST(DistributedOptimizer, StateInACheckpointResumesExactly) {
  LocalWorld world(two_workers());
  std::string dir =
      (std::filesystem::temp_directory_path() / ("ferry-optim-ckpt-" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove_all(dir);
  // Uninterrupted: four Adam steps.
  TwoStages straight;
  DistributedOptimizer straight_optimizer(OptimizerSpec::adam(0.01), straight.parameters());
  for (int step = 0; step < 4; ++step) straight.train_step(straight_optimizer, batch(step));

  // Interrupted after two: checkpoint, then a fresh optimizer and fresh stages restored from it.
  {
    TwoStages before;
    DistributedOptimizer optimizer(OptimizerSpec::adam(0.01), before.parameters());
    for (int step = 0; step < 2; ++step) before.train_step(optimizer, batch(step));
    remote_module::save_checkpoint(dir, {{"first", before.first}, {"second", before.second}}, 2,
                                   {{"optimizer", optimizer.state_dict()}, {"step", int64_t{2}}});
  }
  TwoStages after;
  remote_module::NamedValues extra =
      remote_module::load_checkpoint(dir, {{"first", after.first}, {"second", after.second}});
  ASSERT_EQ(extra.at("step").toInt(), 2);
  DistributedOptimizer optimizer(OptimizerSpec::adam(0.01), after.parameters());
  optimizer.load_state_dict(extra.at("optimizer"));
  for (int step = 2; step < 4; ++step) after.train_step(optimizer, batch(step));

  expect_same_parameters(after.first, straight.first, 1e-6);
  expect_same_parameters(after.second, straight.second, 1e-6);
  std::filesystem::remove_all(dir);
}

class TakenStates : public ::testing::TestWithParam<std::string> {};

// A take copies the state as it is at that step: later steps leave the copy alone, and what is
// fetched afterwards trains on from the take exactly.
TEST_P(TakenStates, AStateTakenAtAStepAndFetchedLaterTrainsOnFromThatStep) {
  LocalWorld world(two_workers());
  const OptimizerSpec spec = GetParam() == "sgd" ? OptimizerSpec::sgd(0.1, 0.9)
                                                 : OptimizerSpec{GetParam(), {{"lr", 0.01}}};
  TwoStages straight;
  DistributedOptimizer straight_optimizer(spec, straight.parameters());
  for (int step = 0; step < 4; ++step) straight.train_step(straight_optimizer, batch(step));

  TwoStages running;
  DistributedOptimizer running_optimizer(spec, running.parameters());
  for (int step = 0; step < 2; ++step) running.train_step(running_optimizer, batch(step));
  const auto first_weights = running.first.state_dict();
  const auto second_weights = running.second.state_dict();
  const DistributedOptimizer::TakenState taken = running_optimizer.take_state();
  for (int step = 2; step < 4; ++step) running.train_step(running_optimizer, batch(step));

  TwoStages after;
  after.first.load_state_dict(first_weights);
  after.second.load_state_dict(second_weights);
  DistributedOptimizer optimizer(spec, after.parameters());
  optimizer.load_state_dict(taken.fetch());
  for (int step = 2; step < 4; ++step) after.train_step(optimizer, batch(step));
  expect_same_parameters(after.first, straight.first, 1e-6);
  expect_same_parameters(after.second, straight.second, 1e-6);
}

// "test.adam_serialized_at_take" is a registered type without copy_state.
INSTANTIATE_TEST_SUITE_P(Types, TakenStates,
                         ::testing::Values("sgd", "adam", "adamw", "test.adam_serialized_at_take"));

TEST(DistributedOptimizer, AccumulatedContextsStepAsOneContextOfTheirSummedLosses) {
  LocalWorld world(two_workers());
  auto loss_of = [](const TwoStages& stages, const at::Tensor& x) {
    at::Tensor y = stages.second.forward({stages.first.forward({x})}).toTensor();
    return (y * y).mean();
  };
  TwoStages accumulating, whole;
  DistributedOptimizer accumulating_optimizer(OptimizerSpec::sgd(0.1, 0.9),
                                              accumulating.parameters());
  DistributedOptimizer whole_optimizer(OptimizerSpec::sgd(0.1, 0.9), whole.parameters());
  // Two optimizer steps of three batches each: the sum must not leak from one step to the next.
  for (int round = 0; round < 2; ++round) {
    for (int k = 0; k < 3; ++k) {
      Context context;
      backward(context.id(), {loss_of(accumulating, batch(3 * round + k)) / 3});
      if (k < 2) {
        accumulating_optimizer.accumulate(context.id());
      } else {
        accumulating_optimizer.step(context.id());
      }
    }
    Context context;
    at::Tensor sum = loss_of(whole, batch(3 * round)) + loss_of(whole, batch(3 * round + 1)) +
                     loss_of(whole, batch(3 * round + 2));
    backward(context.id(), {sum / 3});
    whole_optimizer.step(context.id());
  }
  expect_same_parameters(accumulating.first, whole.first, 1e-6);
  expect_same_parameters(accumulating.second, whole.second, 1e-6);
  // And they did move: the equality above is not that of two untouched models.
  TwoStages untouched;
  EXPECT_FALSE(torch::allclose(untouched.first.state_dict().begin()->value(),
                               whole.first.state_dict().begin()->value()));
}

// Two replicas of two stages, each on its half of every batch (six samples), against one copy
// trained on the whole batches; each optimizer step sums `accumulate` batches.
struct ReplicatedAndWhole {
  explicit ReplicatedAndWhole(double bucket_mib)
      : replica0("a", "b"),
        replica1("c", "d"),
        whole("e", "f"),
        replicated(
            OptimizerSpec::adam(0.01),
            std::vector<std::vector<rpc::RRefPtr>>{replica0.parameters(), replica1.parameters()},
            bucket_mib),
        alone(OptimizerSpec::adam(0.01), whole.parameters()) {}

  static LocalWorld::Settings world() {
    LocalWorld::Settings settings;
    settings.peer_names = {"a", "b", "c", "d", "e", "f"};
    return settings;
  }

  // One backward per replica, each on a thread of its own with its context current there.
  std::vector<std::int64_t> replicas_backward(const at::Tensor& x,
                                              std::vector<std::unique_ptr<Context>>& contexts) {
    std::vector<std::int64_t> ids(2);
    contexts.resize(2);
    std::vector<std::thread> threads;
    const TwoStages* replicas[] = {&replica0, &replica1};
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        contexts[r] = std::make_unique<Context>();
        at::Tensor y = replicas[r]
                           ->second.forward({replicas[r]->first.forward({x.narrow(0, 3 * r, 3)})})
                           .toTensor();
        backward(contexts[r]->id(), {(y * y).mean() / accumulate});
        ids[r] = contexts[r]->id();
      });
    }
    for (auto& t : threads) t.join();
    return ids;
  }

  void train(int steps) {
    for (int step = 0; step < steps; ++step) {
      for (int k = 0; k < accumulate; ++k) {
        at::Tensor x = torch::randn({6, 4});
        std::vector<std::unique_ptr<Context>> contexts;
        std::vector<std::int64_t> ids = replicas_backward(x, contexts);
        Context context;
        at::Tensor y = whole.second.forward({whole.first.forward({x})}).toTensor();
        backward(context.id(), {(y * y).mean() / accumulate});
        if (k + 1 < accumulate) {
          replicated.accumulate(ids);
          alone.accumulate(context.id());
        } else {
          replicated.step(ids);
          alone.step(context.id());
        }
      }
    }
  }

  void expect_equal() const {
    expect_same_parameters(replica0.first, whole.first, 1e-5);
    expect_same_parameters(replica0.second, whole.second, 1e-5);
    expect_same_parameters(replica1.first, replica0.first, 1e-6);
    expect_same_parameters(replica1.second, replica0.second, 1e-6);
  }

  int accumulate = 1;
  TwoStages replica0, replica1, whole;
  DistributedOptimizer replicated, alone;
};

// Data parallel beside model parallel: two replicas of two stages, each on its half of every
// batch, stay equal to each other and to one copy trained on the whole batches.
TEST(DistributedOptimizer, ReplicasAveragingGradientsEqualOneCopyOnTheWholeBatch) {
  LocalWorld world(ReplicatedAndWhole::world());
  ReplicatedAndWhole job(DistributedOptimizer::kDefaultBucketMib);
  EXPECT_EQ(job.replicated.replica_count(), 2);
  EXPECT_EQ(job.replicated.owners(), (std::vector<std::string>{"a", "b"}));
  job.train(3);
  job.expect_equal();
  // Every stage's parameters fit one bucket of 25 MiB.
  for (const auto& owner : job.replicated.bucket_stats()) {
    EXPECT_EQ(owner.buckets, 1) << owner.worker;
  }
  // Stepping a replicated optimizer needs a context per replica.
  EXPECT_THAT(error_of([&] { job.replicated.step(int64_t{1}); }),
              HasSubstr("step given 1 autograd contexts for 2 replicas"));
}

// With a bucket per parameter, the first step learns how many gradients each parameter gets;
// from then on every bucket's all-reduce starts during the backward of the step's last
// accumulated batch, never at the step, and the result is still the whole batches'.
TEST(DistributedOptimizer, ReplicasStartEachBucketsAllReduceDuringTheBackward) {
  LocalWorld world(ReplicatedAndWhole::world());
  ReplicatedAndWhole job(/*bucket_mib=*/1e-5);
  job.accumulate = 2;
  job.train(3);
  job.expect_equal();
  const auto stats = job.replicated.bucket_stats();
  ASSERT_EQ(stats.size(), 4u);  // two owners per replica
  for (const auto& owner : stats) {
    // test.mlp stages: two linear layers, a weight and a bias each.
    EXPECT_EQ(owner.buckets, 4) << owner.worker;
    EXPECT_EQ(owner.started_at_step, 4) << owner.worker;  // the first step's
    EXPECT_EQ(owner.started_in_backward, 2 * 4) << owner.worker;
    EXPECT_EQ(owner.late_rounds, 0) << owner.worker;
  }
}

// A step that brings a parameter more gradients than the first step taught still averages
// exactly: the first step had one batch, the second sums two, so every bucket starts in the first
// batch's backward and the second batch's gradients come late; they go round once more.
TEST(DistributedOptimizer, ReplicasAverageExactlyWhenGradientsArriveAfterTheirBucketStarted) {
  LocalWorld world(ReplicatedAndWhole::world());
  ReplicatedAndWhole job(/*bucket_mib=*/1e-5);
  job.train(1);
  job.accumulate = 2;
  job.train(2);
  job.expect_equal();
  for (const auto& owner : job.replicated.bucket_stats()) {
    // The step after learns the larger count: no late round there.
    EXPECT_EQ(owner.late_rounds, 1) << owner.worker;
    EXPECT_EQ(owner.started_in_backward, 2 * 4) << owner.worker;
  }
}

// A lost replica's owner rebuilt from another replica's: each owner says whether it stands where
// the last step left every owner, and a new optimizer's owners of both replicas load replica 1's
// state, parked on its workers, as their own.
TEST(DistributedOptimizer, AnOwnerTakesTheStateOfTheSameParametersFromAnotherReplica) {
  LocalWorld world(ReplicatedAndWhole::world());
  ReplicatedAndWhole job(DistributedOptimizer::kDefaultBucketMib);
  job.train(2);
  EXPECT_EQ(job.replicated.steps(), 2);
  for (const auto& [replica, worker] :
       std::vector<std::pair<int, std::string>>{{0, "a"}, {0, "b"}, {1, "c"}, {1, "d"}}) {
    EXPECT_TRUE(job.replicated.between_steps(replica, worker)) << worker;
  }
  EXPECT_FALSE(job.replicated.between_steps(0, "c"));  // replica 1's
  EXPECT_FALSE(job.replicated.between_steps(0, "e"));  // no owner there
  EXPECT_THAT(error_of([&] {
                job.replicated.park_owners({{0, "e", 1}});
              }),
              HasSubstr("worker \"e\" holds no parameters of replica 0"));

  DistributedOptimizer fresh(
      OptimizerSpec::adam(0.01),
      std::vector<std::vector<rpc::RRefPtr>>{job.replica0.parameters(), job.replica1.parameters()});
  fresh.load_parked(
      job.replicated.park_owners({{1, "c", 0}, {1, "d", 0}, {1, "c", 1}, {1, "d", 1}}));
  EXPECT_EQ(fresh.steps(), 0);
  EXPECT_TRUE(fresh.between_steps(0, "a"));
  const auto mine = fresh.state_dict().toList().vec();
  const auto theirs = job.replicated.state_dict().toList().vec();
  ASSERT_EQ(mine.size(), theirs.size());
  for (std::size_t i = 0; i < mine.size(); ++i) {
    ASSERT_GT(theirs[i].toTensor().numel(), 0) << "parameter " << i;
    EXPECT_TRUE(torch::equal(mine[i].toTensor(), theirs[i].toTensor())) << "parameter " << i;
  }
}

TEST(DistributedOptimizer, ReplicasPlacedUnalikeOrSharingAWorkerAreRefused) {
  LocalWorld::Settings settings;
  settings.peer_names = {"a", "b", "c"};
  LocalWorld world(settings);
  TwoStages replica0("a", "b"), on_one("c", "c"), sharing("b", "c");
  EXPECT_THAT(error_of([&] {
                DistributedOptimizer(OptimizerSpec::sgd(0.1),
                                     std::vector<std::vector<rpc::RRefPtr>>{replica0.parameters(),
                                                                            on_one.parameters()});
              }),
              HasSubstr("replica 1's parameters are spread over workers c unlike replica 0's "
                        "over a, b"));
  EXPECT_THAT(error_of([&] {
                DistributedOptimizer(OptimizerSpec::sgd(0.1),
                                     std::vector<std::vector<rpc::RRefPtr>>{replica0.parameters(),
                                                                            sharing.parameters()});
              }),
              HasSubstr("worker \"b\" holds parameters of replicas 0 and 1"));
}

TEST(DistributedOptimizer, StateOfTheWrongSizeIsRefused) {
  LocalWorld world(two_workers());
  TwoStages stages;
  DistributedOptimizer optimizer(OptimizerSpec::sgd(0.1), stages.parameters());
  EXPECT_THAT(kind_and_error_of([&] { optimizer.load_state_dict(c10::List<at::Tensor>()); }),
              HasSubstr("optimizer state must be a list of"));
}

// Two wider stages (about 430 KiB of parameters and Adam's moments) on any two workers.
TwoStages wide_stages(const std::string& first_worker, const std::string& second_worker) {
  return TwoStages(first_worker, second_worker, mlp_config(4, 512, 32, 7),
                   mlp_config(32, 512, 1, 8));
}

// Stages moved to other workers mid-run take their parameters and Adam's state straight from
// where they were: the run goes on as if nothing moved, and what moved did not pass through this
// process.
TEST(DistributedOptimizer, StateHandedOverWorkerToWorkerTrainsOnExactly) {
  LocalWorld::Settings settings;
  settings.peer_names = {"a", "b", "c"};
  LocalWorld world(settings);
  TwoStages straight = wide_stages("a", "b");
  DistributedOptimizer straight_optimizer(OptimizerSpec::adam(0.01), straight.parameters());
  for (int step = 0; step < 4; ++step) straight.train_step(straight_optimizer, batch(step));

  auto before = std::make_unique<TwoStages>(wide_stages("a", "b"));
  auto optimizer =
      std::make_unique<DistributedOptimizer>(OptimizerSpec::adam(0.01), before->parameters());
  for (int step = 0; step < 2; ++step) before->train_step(*optimizer, batch(step));
  const std::uint64_t received = rpc::agent().bytes_received();
  const std::uint64_t sent = rpc::agent().bytes_sent();
  const rpc::RRefPtr first_park = remote_module::park_state(before->first);
  const rpc::RRefPtr second_park = remote_module::park_state(before->second);
  const std::vector<DistributedOptimizer::Parked> optimizer_parks = optimizer->park();
  ASSERT_EQ(optimizer_parks.size(), 2u);
  optimizer.reset();
  before.reset();
  // The first stage goes to c, the second to a, where the first was.
  TwoStages after = wide_stages("c", "a");
  remote_module::load_parked_state(after.first, {first_park});
  remote_module::load_parked_state(after.second, {second_park});
  DistributedOptimizer moved(OptimizerSpec::adam(0.01), after.parameters());
  moved.load_parked(optimizer_parks);
  const std::uint64_t moved_bytes = 3 * static_cast<std::uint64_t>(after.first.parameter_bytes() +
                                                                   after.second.parameter_bytes());
  ASSERT_GT(moved_bytes, 300u << 10);
  EXPECT_LT(rpc::agent().bytes_received() - received, moved_bytes / 10);
  EXPECT_LT(rpc::agent().bytes_sent() - sent, moved_bytes / 10);
  for (int step = 2; step < 4; ++step) after.train_step(moved, batch(step));
  expect_same_parameters(after.first, straight.first, 1e-6);
  expect_same_parameters(after.second, straight.second, 1e-6);
}

TEST(DistributedOptimizer, AHandoverThatFindsNothingNamesTheStageAndTheWorker) {
  LocalWorld world(two_workers());
  TwoStages stages;
  DistributedOptimizer optimizer(OptimizerSpec::adam(0.01), stages.parameters());
  EXPECT_THAT(kind_and_error_of([&] { remote_module::load_parked_state(stages.second, {}); }),
              HasSubstr("stage \"test.mlp\" on worker \"b\" found 4 of its tensors in no park "
                        "of the 0 it was given"));
  EXPECT_THAT(kind_and_error_of([&] { optimizer.load_parked({}); }),
              HasSubstr("found the state of parameters 0, 1, 2, 3 in none of the 0 parks"));
}

}  // namespace
}  // namespace ferry::dist_autograd
