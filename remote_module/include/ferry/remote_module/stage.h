// Stages: the parts of a model that workers host. A stage type is registered once by name with a
// factory that builds it from a configuration, so any worker can build any registered stage when
// a master asks for it. Registration and lookup are safe from any thread; a Stage itself is used
// by one call at a time (its worker serialises calls on it).
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ferry/remote_module/step_statistics.h"

namespace torch::nn {
class Module;
}

namespace ferry::remote_module {

// A stage's configuration: string keys, values of any type (LibTorch has no typed dict of IValues).
using StageConfig = c10::impl::GenericDict;
inline StageConfig stage_config() {
  return StageConfig(c10::StringType::get(), c10::AnyType::get());
}
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// One block's compute so far in a stage made of blocks that times them as it runs. Value type.
struct BlockSeconds {
  std::string name;
  double forward_s = 0;
  double backward_s = 0;
};

class Stage {
 public:
  virtual ~Stage() = default;
  // Tensors, lists of tensors or tuples in and out.
  virtual c10::IValue forward(std::vector<c10::IValue> inputs) = 0;
  virtual NamedTensors named_parameters() = 0;
  virtual NamedTensors named_buffers() = 0;
  virtual void train(bool on) = 0;
  virtual bool is_training() = 0;
  virtual void to(const c10::Device& device) = 0;
  // Hands `sum` to each of its layers that can take statistics over a whole step
  // (step_statistics.h); returns how many did.
  virtual int64_t take_step_statistics(const SumOverReplicas& /*sum*/) { return 0; }
  // Each of its blocks' compute so far, in forward order; empty when it does not time them.
  virtual std::vector<BlockSeconds> block_seconds() { return {}; }
};

// A stage made of a torch::nn::Module and the function that runs it on IValues.
class ModuleStage final : public Stage {
 public:
  using Forward = std::function<c10::IValue(std::vector<c10::IValue>&)>;
  using BlockTimes = std::function<std::vector<BlockSeconds>()>;
  ModuleStage(std::shared_ptr<torch::nn::Module> module, Forward forward,
              BlockTimes block_times = {});

  c10::IValue forward(std::vector<c10::IValue> inputs) override;
  NamedTensors named_parameters() override;
  NamedTensors named_buffers() override;
  void train(bool on) override;
  bool is_training() override;
  void to(const c10::Device& device) override;
  int64_t take_step_statistics(const SumOverReplicas& sum) override;
  std::vector<BlockSeconds> block_seconds() override;

 private:
  std::shared_ptr<torch::nn::Module> module_;
  Forward forward_;
  BlockTimes block_times_;
};

// A stage exported from Python with torch.jit.script or torch.jit.trace and saved to `path`.
// Throws rpc::Error(InvalidArgument) naming the file if it is missing or does not load.
std::unique_ptr<Stage> load_torchscript_stage(const std::string& path);

using StageFactory = std::function<std::unique_ptr<Stage>(const StageConfig& config)>;

// Throws rpc::Error(InvalidArgument) if `type` is taken.
void register_stage(const std::string& type, StageFactory factory);
std::vector<std::string> registered_stages();
// Throws rpc::Error(InvalidArgument) listing the registered types if `type` is unknown.
std::unique_ptr<Stage> make_stage(const std::string& type, const StageConfig& config);

// Typed reads of a configuration field: a missing or wrong-typed field is an error naming the
// stage type, the field and what was expected. Inside a factory, the configuration knows its
// stage's type: config_int(config, "depth", 34).
int64_t config_int(const StageConfig& config, const std::string& field);
int64_t config_int(const StageConfig& config, const std::string& field, int64_t fallback);
double config_double(const StageConfig& config, const std::string& field, double fallback);
// The same for a configuration built by hand, with the stage's type to name in errors.
int64_t config_int(const StageConfig& config, const std::string& stage, const std::string& field);
int64_t config_int(const StageConfig& config, const std::string& stage, const std::string& field,
                   int64_t fallback);
double config_double(const StageConfig& config, const std::string& stage, const std::string& field,
                     double fallback);

namespace detail {
// At a program's start-up a name registered twice ends the process (the exception leaves a
// static initializer); while a plugin loads (stage_plugin.h), it is recorded for the loader to
// report instead, since an exception must not cross dlopen.
void register_stage_at_load(const std::string& type, StageFactory factory);
struct StageRegistration {
  StageRegistration(const std::string& type, StageFactory factory) {
    register_stage_at_load(type, std::move(factory));
  }
};
}  // namespace detail

}  // namespace ferry::remote_module

// Registers a stage type at start-up, or when the plugin holding it loads:
// FERRY_REGISTER_STAGE("unet.encoder", make_encoder);
#define FERRY_REGISTER_STAGE(type, factory)                                    \
  static ::ferry::remote_module::detail::StageRegistration FERRY_STAGE_CONCAT( \
      ferry_stage_, __LINE__)(type, factory)
#define FERRY_STAGE_CONCAT_INNER(a, b) a##b
#define FERRY_STAGE_CONCAT(a, b) FERRY_STAGE_CONCAT_INNER(a, b)
