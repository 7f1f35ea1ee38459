#include "tests/support/test_stages.h"

#include <torch/torch.h>

#include "ferry/remote_module/loss.h"
#include "ferry/rpc/error.h"

namespace ferry::testing {
namespace {

using remote_module::config_double;
using remote_module::config_int;
using remote_module::ModuleStage;
using remote_module::Stage;
using remote_module::StageConfig;

std::unique_ptr<Stage> make_mlp(const StageConfig& config) {
  int64_t in = config_int(config, "in");
  int64_t hidden = config_int(config, "hidden");
  int64_t out = config_int(config, "out");
  torch::manual_seed(config_int(config, "seed", 0));
  auto net = std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(in, hidden));
  if (config_int(config, "batchnorm", 0) != 0) net->push_back(torch::nn::BatchNorm1d(hidden));
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Dropout(config_double(config, "dropout", 0.0)));
  net->push_back(torch::nn::Linear(hidden, out));
  return std::make_unique<ModuleStage>(net, [net](std::vector<c10::IValue>& inputs) {
    if (inputs.size() != 1 || !inputs[0].isTensor()) {
      throw rpc::Error(rpc::ErrorKind::InvalidArgument, "test.mlp takes one tensor");
    }
    return c10::IValue(net->forward(inputs[0].toTensor()));
  });
}

struct PyramidImpl : torch::nn::Module {
  explicit PyramidImpl(int64_t channels)
      : conv(register_module(
            "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, channels, 3).padding(1)))),
        norm(register_module("norm", torch::nn::BatchNorm2d(channels))) {}
  std::vector<at::Tensor> forward(const at::Tensor& x) {
    at::Tensor full = torch::relu(norm(conv(x)));
    at::Tensor half = torch::avg_pool2d(full, 2);
    return {full, half, torch::avg_pool2d(half, 2)};
  }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d norm;
};

std::unique_ptr<Stage> make_pyramid(const StageConfig& config) {
  torch::manual_seed(config_int(config, "seed", 0));
  auto net = std::make_shared<PyramidImpl>(config_int(config, "channels"));
  return std::make_unique<ModuleStage>(net, [net](std::vector<c10::IValue>& inputs) {
    return c10::IValue(net->forward(inputs.at(0).toTensor()));
  });
}

}  // namespace

void register_test_stages() {
  static bool done = [] {
    remote_module::register_stage("test.mlp", make_mlp);
    remote_module::register_stage("test.pyramid", make_pyramid);
    remote_module::register_loss("test.mse", [](const at::Tensor& out, const at::Tensor& target) {
      return torch::mse_loss(out, target);
    });
    return true;
  }();
  (void)done;
}

StageConfig mlp_config(int64_t in, int64_t hidden, int64_t out, int64_t seed) {
  StageConfig config = remote_module::stage_config();
  config.insert("in", in);
  config.insert("hidden", hidden);
  config.insert("out", out);
  config.insert("seed", seed);
  return config;
}

std::unique_ptr<Stage> make_local_stage(const std::string& type, const StageConfig& config,
                                        const c10::Dict<std::string, at::Tensor>& state) {
  std::unique_ptr<Stage> stage = remote_module::make_stage(type, config);
  torch::NoGradGuard no_grad;
  for (auto named : {stage->named_parameters(), stage->named_buffers()}) {
    for (auto& [name, tensor] : named) tensor.copy_(state.at(name));
  }
  return stage;
}

}  // namespace ferry::testing
