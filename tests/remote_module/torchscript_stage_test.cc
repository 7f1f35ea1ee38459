// TorchScript files as stages: written here with the C++ TorchScript API (what a Python user
// gets from torch.jit.script(...).save()), loaded on a worker process.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include <fstream>

#include "ferry/remote_module/remote_module.h"
#include "tests/support/cluster.h"
#include "tests/support/error_of.h"

namespace ferry {
namespace {

using ferry::testing::error_of;
using ferry::testing::LocalWorld;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "ferry_" + std::to_string(::getpid()) + "_" + name;
}

torch::jit::Module scripted_layer() {
  torch::manual_seed(5);
  torch::jit::Module m("Layer");
  m.register_parameter("weight", torch::randn({8, 4}), false);
  m.register_parameter("bias", torch::randn({4}), false);
  m.register_buffer("scale", torch::full({1}, 0.5));
  m.define(R"(
def forward(self, x):
    return torch.relu(x.mm(self.weight) + self.bias) * self.scale
)");
  return m;
}

TEST(TorchScriptStage, ForwardMatchesTheLocalModuleAndItsStateIsReachable) {
  LocalWorld world;
  torch::jit::Module local = scripted_layer();
  std::string path = temp_path("layer.pt");
  local.save(path);
  RemoteModule remote = RemoteModule::from_torchscript("a", path);
  at::Tensor x = torch::randn({3, 8});
  at::Tensor expected = local.forward({x}).toTensor();
  EXPECT_TRUE(torch::equal(remote.forward({x}).toTensor(), expected));
  EXPECT_EQ(remote.parameter_count(), 8 * 4 + 4);
  auto state = remote.state_dict();
  EXPECT_TRUE(torch::equal(state.at("weight"), local.attr("weight").toTensor()));
  EXPECT_TRUE(torch::equal(state.at("scale"), torch::full({1}, 0.5)));
  EXPECT_EQ(remote.remote_parameters().size(), 2u);
  // Its parameters take new values like any stage's.
  state.insert_or_assign("bias", torch::full({4}, 100.0));
  remote.load_state_dict(state);
  at::Tensor shifted = remote.forward({x}).toTensor();
  EXPECT_TRUE(torch::all(shifted >= 40.0).item<bool>());
  std::remove(path.c_str());
}

TEST(TorchScriptStage, MissingOrBrokenFilesAreNamed) {
  LocalWorld world;
  std::string missing = temp_path("missing.pt");
  std::string error = error_of([&] { RemoteModule::from_torchscript("a", missing); });
  EXPECT_NE(error.find("cannot create stage \"torchscript " + missing +
                       "\" on worker \"a\": TorchScript file \"" + missing +
                       "\" does not exist or cannot be read"),
            std::string::npos)
      << error;
  std::string broken = temp_path("broken.pt");
  std::ofstream(broken) << "not a zip archive";
  error = error_of([&] { RemoteModule::from_torchscript("b", broken); });
  EXPECT_NE(error.find("TorchScript file \"" + broken + "\" does not load"), std::string::npos)
      << error;
  std::remove(broken.c_str());
  // The workers still serve.
  EXPECT_EQ(rpc::rpc_sync("a", "echo", {int64_t{3}}).toInt(), 3);
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

TEST(TorchScriptStage, GradientsFlowThroughTheLoadedStageAsThroughTheModule) {
  torch::jit::Module module = scripted_layer();
  std::string path = temp_path("grad.pt");
  module.save(path);
  std::unique_ptr<Stage> stage = load_torchscript_stage(path);
  torch::jit::Module reference = torch::jit::load(path);
  for (auto p : reference.parameters()) p.set_requires_grad(true);
  for (auto& [name, p] : stage->named_parameters()) p.set_requires_grad(true);
  at::Tensor x = torch::randn({6, 8});
  stage->forward({x}).toTensor().pow(2).sum().backward();
  reference.forward({x}).toTensor().pow(2).sum().backward();
  auto named = stage->named_parameters();
  ASSERT_EQ(named.size(), 2u);
  for (auto& [name, p] : named) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_TRUE(torch::equal(p.grad(), reference.attr(name).toTensor().grad())) << name;
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ferry
