#include "ferry/remote_module/stage.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <map>
#include <mutex>

#include "ferry/rpc/error.h"

namespace ferry::remote_module {
namespace {

struct StageRegistry {
  std::mutex mutex;
  std::map<std::string, StageFactory> factories;
};

StageRegistry& stage_registry() {
  static auto* r = new StageRegistry();  // never destroyed: stages may register during static init
  return *r;
}

NamedTensors to_vector(const torch::OrderedDict<std::string, at::Tensor>& dict) {
  NamedTensors out;
  for (const auto& item : dict) out.emplace_back(item.key(), item.value());
  return out;
}

// make_stage hands a factory its configuration with the stage's type under this key, so that the
// typed reads name the stage without the factory repeating it.
constexpr const char* kTypeKey = "ferry.stage_type";

std::string stage_type_of(const StageConfig& config) {
  auto it = config.find(c10::IValue(kTypeKey));
  return it != config.end() && it->value().isString() ? it->value().toStringRef()
                                                      : std::string("?");
}

const c10::IValue& field(const StageConfig& config, const std::string& stage,
                         const std::string& name) {
  auto it = config.find(c10::IValue(name));
  if (it == config.end()) {
    std::vector<std::string> given;
    for (const auto& entry : config) {
      if (entry.key().toStringRef() != kTypeKey) given.push_back(entry.key().toStringRef());
    }
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("stage \"{}\" needs config field \"{}\" (given: {})", stage, name,
                                 given.empty() ? std::string("none")
                                               : fmt::format("{}", fmt::join(given, ", "))));
  }
  return it->value();
}

}  // namespace

ModuleStage::ModuleStage(std::shared_ptr<torch::nn::Module> module, Forward forward,
                         BlockTimes block_times)
    : module_(std::move(module)),
      forward_(std::move(forward)),
      block_times_(std::move(block_times)) {}

c10::IValue ModuleStage::forward(std::vector<c10::IValue> inputs) { return forward_(inputs); }
NamedTensors ModuleStage::named_parameters() { return to_vector(module_->named_parameters()); }
NamedTensors ModuleStage::named_buffers() { return to_vector(module_->named_buffers()); }
void ModuleStage::train(bool on) { module_->train(on); }
bool ModuleStage::is_training() { return module_->is_training(); }
void ModuleStage::to(const c10::Device& device) { module_->to(device); }
std::vector<BlockSeconds> ModuleStage::block_seconds() {
  return block_times_ ? block_times_() : std::vector<BlockSeconds>{};
}

int64_t ModuleStage::take_step_statistics(const SumOverReplicas& sum) {
  int64_t layers = 0;
  for (const auto& module : module_->modules()) {
    if (auto* layer = dynamic_cast<StepStatistics*>(module.get())) {
      layer->take_step_statistics(sum);
      ++layers;
    }
  }
  return layers;
}

void register_stage(const std::string& type, StageFactory factory) {
  StageRegistry& r = stage_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.factories.emplace(type, std::move(factory)).second) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("stage type \"{}\" is already registered", type));
  }
}

std::vector<std::string> registered_stages() {
  StageRegistry& r = stage_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& entry : r.factories) out.push_back(entry.first);
  return out;
}

std::unique_ptr<Stage> make_stage(const std::string& type, const StageConfig& config) {
  StageFactory factory;
  {
    StageRegistry& r = stage_registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.factories.find(type);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::vector<std::string> known = registered_stages();
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("unknown stage type \"{}\" (registered: {})", type,
                                 known.empty() ? std::string("none")
                                               : fmt::format("{}", fmt::join(known, ", "))));
  }
  StageConfig named = config.copy();
  named.insert_or_assign(kTypeKey, type);
  return factory(named);
}

int64_t config_int(const StageConfig& config, const std::string& stage, const std::string& name) {
  const c10::IValue& value = field(config, stage, name);
  if (!value.isInt()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("config field \"{}\" of stage \"{}\" must be an int but is {}",
                                 name, stage, value.tagKind()));
  }
  return value.toInt();
}

int64_t config_int(const StageConfig& config, const std::string& stage, const std::string& name,
                   int64_t fallback) {
  return config.contains(c10::IValue(name)) ? config_int(config, stage, name) : fallback;
}

double config_double(const StageConfig& config, const std::string& stage, const std::string& name,
                     double fallback) {
  if (!config.contains(c10::IValue(name))) return fallback;
  const c10::IValue& value = field(config, stage, name);
  if (!value.isDouble() && !value.isInt()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("config field \"{}\" of stage \"{}\" must be a float but is {}",
                                 name, stage, value.tagKind()));
  }
  return value.isInt() ? static_cast<double>(value.toInt()) : value.toDouble();
}

int64_t config_int(const StageConfig& config, const std::string& field) {
  return config_int(config, stage_type_of(config), field);
}

int64_t config_int(const StageConfig& config, const std::string& field, int64_t fallback) {
  return config_int(config, stage_type_of(config), field, fallback);
}

double config_double(const StageConfig& config, const std::string& field, double fallback) {
  return config_double(config, stage_type_of(config), field, fallback);
}

}  // namespace ferry::remote_module
