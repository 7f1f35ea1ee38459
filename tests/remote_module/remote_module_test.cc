// Remote modules on real worker processes: the master (this process) builds stages on "a", "b"
// and "c" and compares them with the same stages built here.
#include "ferry/remote_module/remote_module.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "ferry/rpc/rpc.h"
#include "tests/support/cluster.h"
#include "tests/support/error_of.h"
#include "tests/support/wait.h"

namespace ferry::remote_module {
namespace {

using ferry::testing::kind_and_error_of;

using ::testing::HasSubstr;

using ferry::testing::LocalWorld;
using std::chrono::milliseconds;

LocalWorld::Settings three_workers() {
  LocalWorld::Settings settings;
  settings.peer_names = {"a", "b", "c"};
  return settings;
}

StageConfig mlp_config(int64_t seed, double dropout = 0.0) {
  StageConfig config = stage_config();
  config.insert("in", int64_t{8});
  config.insert("hidden", int64_t{16});
  config.insert("out", int64_t{4});
  config.insert("seed", seed);
  config.insert("dropout", dropout);
  return config;
}

TEST(RemoteModule, ForwardMatchesTheSameStageRunLocallyBitForBit) {
  LocalWorld world(three_workers());
  RemoteModule remote = RemoteModule::create("a", "test.mlp", mlp_config(7));
  std::unique_ptr<Stage> local = make_stage("test.mlp", mlp_config(7));
  at::Tensor x = torch::randn({5, 8});
  at::Tensor expected = local->forward({x}).toTensor();
  EXPECT_TRUE(torch::equal(remote.forward({x}).toTensor(), expected));
  auto future = remote.forward_async({x});
  future->wait();
  EXPECT_TRUE(torch::equal(future->value().toTensor(), expected));
  EXPECT_EQ(remote.worker(), "a");
  EXPECT_EQ(remote.type(), "test.mlp");
}

TEST(RemoteModule, ListOutputsComeBackAsLists) {
  LocalWorld world(three_workers());
  StageConfig config = stage_config();
  config.insert("channels", int64_t{3});
  RemoteModule remote = RemoteModule::create("b", "test.pyramid", config);
  std::unique_ptr<Stage> local = make_stage("test.pyramid", config);
  remote.eval();
  local->train(false);
  at::Tensor x = torch::randn({2, 3, 16, 16});
  auto got = remote.forward({x}).toTensorVector();
  auto expected = local->forward({x}).toTensorVector();
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(got[i], expected[i]));
  EXPECT_EQ(got[2].sizes(), (std::vector<int64_t>{2, 3, 4, 4}));
}

TEST(RemoteModule, TrainAndEvalReachTheWorker) {
  LocalWorld world(three_workers());
  RemoteModule remote = RemoteModule::create("a", "test.mlp", mlp_config(1, 0.5));
  at::Tensor x = torch::randn({64, 8});
  remote.eval();
  EXPECT_TRUE(torch::equal(remote.forward({x}).toTensor(), remote.forward({x}).toTensor()));
  remote.train();
  EXPECT_FALSE(torch::equal(remote.forward({x}).toTensor(), remote.forward({x}).toTensor()));
}

TEST(RemoteModule, ParametersAreCountedAndReachableByRRef) {
  LocalWorld world(three_workers());
  RemoteModule remote = RemoteModule::create("c", "test.mlp", mlp_config(3));
  std::unique_ptr<Stage> local = make_stage("test.mlp", mlp_config(3));
  EXPECT_EQ(remote.parameter_count(), 8 * 16 + 16 + 16 * 4 + 4);
  EXPECT_EQ(remote.parameter_bytes(), remote.parameter_count() * 4);
  std::vector<rpc::RRefPtr> params = remote.remote_parameters();
  auto named = local->named_parameters();
  ASSERT_EQ(params.size(), named.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i]->ownerName(), "c");
    EXPECT_TRUE(torch::equal(params[i]->to_here().toTensor(), named[i].second)) << named[i].first;
  }
}

TEST(RemoteModule, StateDictRoundTripsBetweenWorkers) {
  LocalWorld world(three_workers());
  RemoteModule source = RemoteModule::create("a", "test.mlp", mlp_config(11));
  RemoteModule target = RemoteModule::create("b", "test.mlp", mlp_config(12));
  at::Tensor x = torch::randn({3, 8});
  EXPECT_FALSE(torch::equal(source.forward({x}).toTensor(), target.forward({x}).toTensor()));
  auto state = source.state_dict();
  EXPECT_EQ(state.size(), 4u);
  target.load_state_dict(state);
  EXPECT_TRUE(torch::equal(source.forward({x}).toTensor(), target.forward({x}).toTensor()));
}

TEST(RemoteModule, DroppedModulesAreFreedOnTheirWorker) {
  LocalWorld world(three_workers());
  int64_t before = rpc::rpc_sync("b", "owned_rrefs").toInt();
  {
    RemoteModule remote = RemoteModule::create("b", "test.mlp", mlp_config(1));
    auto params = remote.remote_parameters();
    EXPECT_EQ(rpc::rpc_sync("b", "owned_rrefs").toInt(), before + 1 + 4);
  }
  int64_t after = -1;
  ferry::testing::wait_until(
      [&] { return (after = rpc::rpc_sync("b", "owned_rrefs").toInt()) == before; },
      std::chrono::seconds(5));
  EXPECT_EQ(after, before);
}

TEST(RemoteModule, BadRequestsAreClearErrorsAndTheWorkerKeepsServing) {
  LocalWorld world(three_workers());
  std::string unknown = kind_and_error_of([] { RemoteModule::create("a", "unet.nothing"); });
  EXPECT_THAT(unknown,
              HasSubstr("cannot create stage \"unet.nothing\" on worker \"a\": unknown "
                        "stage type \"unet.nothing\" (registered: synthetic.mlp, test.mlp, "
                        "test.pyramid, unet.blocks, unet.decoder, unet.encoder, unet.head)"))
      << unknown;

  StageConfig missing = mlp_config(1);
  ASSERT_EQ(missing.erase(c10::IValue("hidden")), 1u);
  std::string no_field = kind_and_error_of([&] { RemoteModule::create("a", "test.mlp", missing); });
  EXPECT_THAT(no_field, HasSubstr("stage \"test.mlp\" needs config field \"hidden\" (given: in, "
                                  "out, seed, dropout)"))
      << no_field;

  StageConfig wrong = mlp_config(1);
  wrong.insert_or_assign("in", std::string("eight"));
  std::string wrong_type = kind_and_error_of([&] { RemoteModule::create("a", "test.mlp", wrong); });
  EXPECT_THAT(wrong_type, HasSubstr("config field \"in\" of stage \"test.mlp\" must be an int but "
                                    "is String"))
      << wrong_type;

  RemoteModule remote = RemoteModule::create("a", "test.mlp", mlp_config(1));
  std::string shape = kind_and_error_of([&] { remote.forward({torch::randn({2, 5})}); });
  EXPECT_THAT(shape, HasSubstr("RemoteException: forward of stage \"test.mlp\" on worker \"a\" "
                               "failed: forward of stage \"test.mlp\" on worker \"a\": "))
      << shape;
  EXPECT_THAT(shape, HasSubstr("mat1 and mat2 shapes cannot be multiplied")) << shape;

  auto bad_state = remote.state_dict();
  bad_state.insert_or_assign("0.weight", torch::zeros({3, 3}));
  bad_state.insert("extra", torch::zeros({1}));
  std::string state = kind_and_error_of([&] { remote.load_state_dict(bad_state); });
  EXPECT_THAT(state, HasSubstr("mis-shaped: 0.weight (expected [16, 8], got [3, 3])")) << state;
  EXPECT_THAT(state, HasSubstr("unexpected: extra")) << state;

  // Still serving, the stage unharmed.
  EXPECT_EQ(remote.forward({torch::randn({2, 8})}).toTensor().sizes(),
            (std::vector<int64_t>{2, 4}));
}

}  // namespace
}  // namespace ferry::remote_module

namespace ferry::remote_module {
namespace {

std::unique_ptr<Stage> make_identity(const StageConfig&) {
  auto module = std::make_shared<torch::nn::Module>();
  return std::make_unique<ModuleStage>(
      module, [](std::vector<c10::IValue>& inputs) { return inputs.at(0); });
}
FERRY_REGISTER_STAGE("test.identity", make_identity);

TEST(StageRegistry, TheRegistrationMacroRegistersAtStartUp) {
  auto names = registered_stages();
  EXPECT_NE(std::find(names.begin(), names.end(), "test.identity"), names.end());
  auto stage = make_stage("test.identity", stage_config());
  EXPECT_EQ(stage->forward({int64_t{4}}).toInt(), 4);
  EXPECT_THAT(kind_and_error_of([] { register_stage("test.identity", make_identity); }),
              HasSubstr("InvalidArgument: stage type \"test.identity\" is already registered"));
}

// Reads its configuration without naming its own type: make_stage tells the reads.
std::unique_ptr<Stage> make_reading(const StageConfig& config) {
  config_int(config, "width");
  config_double(config, "scale", 1.0);
  return make_identity(config);
}
FERRY_REGISTER_STAGE("test.reading", make_reading);

TEST(StageRegistry, AFactorysReadsNameItsStageTypeWithoutBeingTold) {
  StageConfig config = stage_config();
  config.insert("width", int64_t{3});
  config.insert("scale", std::string("big"));
  EXPECT_THAT(kind_and_error_of([&] { make_stage("test.reading", config); }),
              HasSubstr("config field \"scale\" of stage \"test.reading\" must be a float but "
                        "is String"));
  ASSERT_EQ(config.erase(c10::IValue("width")), 1u);
  std::string missing = kind_and_error_of([&] { make_stage("test.reading", config); });
  EXPECT_THAT(missing, HasSubstr("stage \"test.reading\" needs config field \"width\" (given: "
                                 "scale)"));
  // The caller's configuration is left as it was.
  EXPECT_EQ(config.size(), 1u);
  // A configuration built by hand names its type in the call.
  EXPECT_EQ(config_int(stage_config(), "test.by_hand", "depth", 34), 34);
  EXPECT_THAT(kind_and_error_of([] { config_int(stage_config(), "test.by_hand", "depth"); }),
              HasSubstr("stage \"test.by_hand\" needs config field \"depth\""));
}

TEST(RemoteModule, BFloat16MixedSendsBFloat16AndKeepsFloat32Parameters) {
  LocalWorld world(three_workers());
  RemoteModule module = RemoteModule::create("a", "test.mlp", mlp_config(3));
  const at::Tensor x = torch::randn({2, 8});
  const at::Tensor full = module.forward({x}).toTensor();
  module.set_precision(Precision::BFloat16Mixed);
  const at::Tensor half = module.forward({x}).toTensor();
  EXPECT_EQ(full.scalar_type(), at::kFloat);
  EXPECT_EQ(half.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(torch::allclose(half.to(at::kFloat), full, 5e-2, 5e-2));
  EXPECT_FALSE(torch::equal(half.to(at::kFloat), full));  // it did compute in bfloat16
  for (const auto& entry : module.state_dict()) {
    EXPECT_EQ(entry.value().scalar_type(), at::kFloat) << entry.key();
  }
  module.set_precision(Precision::Float32);
  EXPECT_TRUE(torch::equal(module.forward({x}).toTensor(), full));
  EXPECT_FALSE(core::value_named(precision_names(), "16-mixed").has_value());
  EXPECT_EQ(core::value_named(precision_names(), "32-true"), Precision::Float32);
  EXPECT_EQ(precision_name(Precision::BFloat16Mixed), "bf16-mixed");
}

TEST(RemoteModule, MovingToADeviceThisWorkerLacksIsANamedError) {
  LocalWorld world;
  RemoteModule remote = RemoteModule::create("a", "test.mlp", mlp_config(1));
  remote.to("cpu");
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has CUDA";
  std::string error = kind_and_error_of([&] { remote.to("cuda:0"); });
  EXPECT_THAT(error, HasSubstr("to of stage \"test.mlp\" on worker \"a\" failed:")) << error;
}

}  // namespace
}  // namespace ferry::remote_module
