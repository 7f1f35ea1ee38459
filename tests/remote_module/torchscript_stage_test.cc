// TorchScript files as stages: written here with the C++ TorchScript API (what a Python user
// gets from torch.jit.script(...).save()), loaded on a worker process.
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ferry/dist_autograd/context.h"
#include "ferry/remote_module/remote_module.h"
#include "tests/support/cluster.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"

namespace ferry::remote_module {
namespace {

using ferry::testing::error_of;
using ferry::testing::LocalWorld;
using ferry::testing::process_temp_dir;

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
  std::string path = process_temp_dir().file("layer.pt");
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
  std::string missing = process_temp_dir().file("missing.pt");
  std::string error = error_of([&] { RemoteModule::from_torchscript("a", missing); });
  EXPECT_NE(error.find("cannot create stage \"torchscript " + missing +
                       "\" on worker \"a\": TorchScript file \"" + missing +
                       "\" does not exist or cannot be read"),
            std::string::npos)
      << error;
  std::string broken = process_temp_dir().file("broken.pt");
  std::ofstream(broken) << "not a zip archive";
  error = error_of([&] { RemoteModule::from_torchscript("b", broken); });
  EXPECT_NE(error.find("TorchScript file \"" + broken + "\" does not load"), std::string::npos)
      << error;
  std::remove(broken.c_str());
  // The workers still serve.
  EXPECT_EQ(rpc::rpc_sync("a", "echo", {int64_t{3}}).toInt(), 3);
}

}  // namespace
}  // namespace ferry::remote_module

namespace ferry::remote_module {
namespace {

TEST(TorchScriptStage, GradientsFlowThroughTheLoadedStageAsThroughTheModule) {
  torch::jit::Module module = scripted_layer();
  std::string path = process_temp_dir().file("grad.pt");
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

// The largest difference between two tensors, relative to the larger of their largest values.
double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  const double scale =
      std::max({a.abs().max().item<double>(), b.abs().max().item<double>(), 1e-12});
  return (a - b).abs().max().item<double>() / scale;
}

// A U-Net exported from Python in three traced parts, as they are: the encoder returns its
// features as a tuple, the decoder takes them as separate arguments. Chained worker to worker,
// they give the whole exported model's output and gradients. Needs Python with torch (Debian's
// python3-torch, which `make test` installs); without it the test says so, and fails under CI.
TEST(TorchScriptStage, PartsExportedFromPythonChainAsTracedAndMatchTheWholeModel) {
  const std::string dir = process_temp_dir().file("parts");
  std::filesystem::create_directories(dir);
  const std::string command = std::string("/usr/bin/python3 ") + FERRY_SOURCE_DIR +
                              "/examples/export_torchscript_stages.py " + dir + " > /dev/null 2>&1";
  if (std::system(command.c_str()) != 0) {
    std::filesystem::remove_all(dir);
    if (std::getenv("CI") != nullptr) FAIL() << "no Python with torch to export the parts";
    GTEST_SKIP() << "no Python with torch to export the parts";
  }
  LocalWorld::Settings settings;
  settings.peer_names = {"a", "b", "c"};
  LocalWorld world(settings);
  const std::vector<RemoteModule> parts = {RemoteModule::from_torchscript("a", dir + "/encoder.pt"),
                                           RemoteModule::from_torchscript("b", dir + "/decoder.pt"),
                                           RemoteModule::from_torchscript("c", dir + "/head.pt")};
  for (const RemoteModule& part : parts) part.eval();
  torch::jit::Module whole = torch::jit::load(dir + "/full.pt");
  whole.eval();
  for (auto p : whole.parameters()) p.set_requires_grad(true);

  torch::manual_seed(3);
  const at::Tensor image = torch::randn({2, 3, 32, 32});
  const at::Tensor weights = torch::randn({2, 1, 32, 32});
  at::Tensor x = image.clone().requires_grad_(true);
  dist_autograd::Context context;
  const at::Tensor out = RemoteModule::forward_chain(parts, {x}).toTensor();
  dist_autograd::backward(context.id(), {(out * weights).sum()});

  at::Tensor x_whole = image.clone().requires_grad_(true);
  const at::Tensor expected = whole.forward({x_whole}).toTensor();
  (expected * weights).sum().backward();
  EXPECT_LE(relative_difference(out, expected), 1e-5);
  EXPECT_LE(relative_difference(dist_autograd::get_gradients(context.id()).at(x), x_whole.grad()),
            1e-5);

  // Each part's parameters are the whole model's under its part's name, in the same order.
  const std::vector<std::string> prefixes = {"encoder.", "decoder.", "segmentation_head."};
  for (size_t k = 0; k < parts.size(); ++k) {
    std::vector<at::Tensor> reference;
    for (const auto& p : whole.named_parameters()) {
      if (p.name.rfind(prefixes[k], 0) == 0) reference.push_back(p.value.grad());
    }
    const std::vector<at::Tensor> grads =
        dist_autograd::get_gradients(context.id(), parts[k].remote_parameters());
    ASSERT_EQ(grads.size(), reference.size()) << prefixes[k];
    ASSERT_FALSE(grads.empty()) << prefixes[k];
    for (size_t i = 0; i < grads.size(); ++i) {
      ASSERT_TRUE(grads[i].defined()) << prefixes[k] << i;
      EXPECT_LE(relative_difference(grads[i], reference[i]), 1e-5) << prefixes[k] << i;
    }
  }

  // The decoder's four arguments from a tuple of three: an error saying what it takes.
  const std::string wrong = error_of([&] {
    parts[1].forward({c10::ivalue::Tuple::create({image, image, image})});
  });
  EXPECT_NE(wrong.find("TorchScript stage \"" + dir + "/decoder.pt\" takes forward(Tensor "),
            std::string::npos)
      << wrong;
  EXPECT_NE(wrong.find("but got 3 inputs (Tensor, Tensor, Tensor)"), std::string::npos) << wrong;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ferry::remote_module
