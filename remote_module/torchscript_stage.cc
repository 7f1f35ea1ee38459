// A TorchScript module as a stage: how a PyTorch user brings an existing model, one exported
// part per stage. Used by one call at a time, as every Stage.
#include <fmt/format.h>
#include <torch/script.h>

#include <fstream>

#include "ferry/remote_module/stage.h"
#include "ferry/rpc/error.h"

namespace ferry {
namespace {

class TorchScriptStage final : public Stage {
 public:
  explicit TorchScriptStage(torch::jit::Module module) : module_(std::move(module)) {}

  c10::IValue forward(std::vector<c10::IValue> inputs) override {
    return module_.forward(std::move(inputs));
  }
  NamedTensors named_parameters() override {
    NamedTensors out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true))
      out.emplace_back(p.name, p.value);
    return out;
  }
  NamedTensors named_buffers() override {
    NamedTensors out;
    for (const auto& b : module_.named_buffers(/*recurse=*/true)) out.emplace_back(b.name, b.value);
    return out;
  }
  void train(bool on) override { module_.train(on); }
  bool is_training() override { return module_.is_training(); }
  void to(const c10::Device& device) override { module_.to(device); }

 private:
  torch::jit::Module module_;
};

}  // namespace

std::unique_ptr<Stage> load_torchscript_stage(const std::string& path) {
  if (!std::ifstream(path).good()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("TorchScript file \"{}\" does not exist or cannot be read", path));
  }
  try {
    return std::make_unique<TorchScriptStage>(torch::jit::load(path));
  } catch (const c10::Error& e) {
    throw rpc::Error(
        rpc::ErrorKind::InvalidArgument,
        fmt::format("TorchScript file \"{}\" does not load: {}", path, e.what_without_backtrace()));
  }
}

}  // namespace ferry
