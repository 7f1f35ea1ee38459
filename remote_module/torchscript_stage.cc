// A TorchScript module as a stage: how a PyTorch user brings an existing model, one exported
// part per stage. Used by one call at a time, as every Stage.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>

#include <fstream>

#include "ferry/remote_module/stage.h"
#include "ferry/rpc/error.h"

namespace ferry::remote_module {
namespace {

// "forward(Tensor x0, Tensor x1)": what a stage's forward takes, for errors.
std::string signature_of(const c10::FunctionSchema& schema) {
  std::vector<std::string> args;
  for (size_t i = 1; i < schema.arguments().size(); ++i) {
    const c10::Argument& a = schema.arguments()[i];
    args.push_back(fmt::format("{} {}", a.type()->str(), a.name()));
  }
  return fmt::format("forward({})", fmt::join(args, ", "));
}

class TorchScriptStage final : public Stage {
 public:
  TorchScriptStage(torch::jit::Module module, std::string path)
      : module_(std::move(module)), path_(std::move(path)) {}

  // As traced: a stage whose forward takes several arguments gets the elements of the tuple or
  // list the stage before returned (smp's encoder returns its features as a list, its decoder
  // takes *features), as torch.distributed.pipelining passes a stage's outputs on.
  c10::IValue forward(std::vector<c10::IValue> inputs) override {
    const c10::FunctionSchema& schema = module_.get_method("forward").function().getSchema();
    const size_t wanted = schema.arguments().size() - 1;  // self is the first
    if (inputs.size() == 1 && wanted > 1 && (inputs[0].isTuple() || inputs[0].isList())) {
      c10::IValue packed = std::move(inputs[0]);
      inputs.clear();
      if (packed.isTuple()) {
        for (const c10::IValue& element : packed.toTupleRef().elements()) inputs.push_back(element);
      } else {
        for (const c10::IValue& element : packed.toListRef()) inputs.push_back(element);
      }
    }
    check_inputs(schema, inputs);
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
  // A count or type that does not fit the forward's arguments, said with what it takes.
  void check_inputs(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& inputs) {
    const std::vector<c10::Argument>& args = schema.arguments();
    bool fits = inputs.size() + 1 <= args.size();
    for (size_t i = 0; fits && i < inputs.size(); ++i) {
      fits = inputs[i].type()->isSubtypeOf(*args[i + 1].type());
    }
    for (size_t i = inputs.size() + 1; fits && i < args.size(); ++i) {
      fits = args[i].default_value().has_value();
    }
    if (fits) return;
    std::vector<std::string> got;
    for (const c10::IValue& input : inputs) got.push_back(input.type()->str());
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("TorchScript stage \"{}\" takes {} but got {} input{} ({})", path_,
                                 signature_of(schema), inputs.size(), inputs.size() == 1 ? "" : "s",
                                 fmt::join(got, ", ")));
  }

  torch::jit::Module module_;
  std::string path_;
};

}  // namespace

std::unique_ptr<Stage> load_torchscript_stage(const std::string& path) {
  if (!std::ifstream(path).good()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("TorchScript file \"{}\" does not exist or cannot be read", path));
  }
  try {
    return std::make_unique<TorchScriptStage>(torch::jit::load(path), path);
  } catch (const c10::Error& e) {
    throw rpc::Error(
        rpc::ErrorKind::InvalidArgument,
        fmt::format("TorchScript file \"{}\" does not load: {}", path, e.what_without_backtrace()));
  }
}

}  // namespace ferry::remote_module
