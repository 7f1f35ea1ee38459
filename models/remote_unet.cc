#include "ferry/models/remote_unet.h"

#include <fmt/format.h>

#include <chrono>
#include <set>
#include <stdexcept>

#include "ferry/core/fail.h"
#include "ferry/models/unet_blocks.h"
#include "ferry/models/weights.h"
#include "ferry/rpc/error.h"

namespace ferry::models {
namespace {

using core::fail;

void check_plan(int64_t depth, const std::vector<RemoteUnet::StagePlan>& plan) {
  const auto count = static_cast<int64_t>(unet_blocks(depth).size());
  if (plan.empty()) fail("a U-Net split needs at least one stage");
  std::set<std::string> names;
  int64_t next = 0;
  for (const auto& stage : plan) {
    if (!names.insert(stage.name).second) {
      fail(fmt::format("two stages are named \"{}\"", stage.name));
    }
    if (stage.first != next || stage.last <= stage.first || stage.last > count) {
      fail(
          fmt::format("stage \"{}\" has blocks [{}, {}) but must start at block {} and hold at "
                      "least one of the {} blocks",
                      stage.name, stage.first, stage.last, next, count));
    }
    next = stage.last;
  }
  if (next != count) {
    fail(fmt::format("the stages end at block {} of {}: the last must end with the head", next,
                     count));
  }
}

}  // namespace

std::vector<RemoteUnet::StagePlan> RemoteUnet::seams(int64_t depth,
                                                     const std::array<std::string, 3>& workers) {
  const std::vector<UnetBlock> blocks = unet_blocks(depth);
  const int64_t decoder = unet_block_index(blocks, "decoder.0");
  const int64_t head = unet_block_index(blocks, "head");
  return {{"encoder", 0, decoder, workers[0], ""},
          {"decoder", decoder, head, workers[1], ""},
          {"head", head, head + 1, workers[2], ""}};
}

remote_module::Routes RemoteUnet::routes_of(int64_t depth, const std::vector<StagePlan>& plan) {
  check_plan(depth, plan);
  const std::vector<UnetBlock> blocks = unet_blocks(depth);
  std::vector<int64_t> low;
  for (const StagePlan& stage : plan) {
    low.push_back(unet_carry_untouched(blocks, stage.first, stage.last));
  }
  remote_module::Routes routes(plan.size());
  for (size_t s = 0; s + 1 < plan.size(); ++s) {
    // Stage s gives back the carry above what it left untouched; each element goes to the first
    // later stage that reaches down to it. Every carry ends in the head, so one does.
    const int64_t carry_out = blocks[plan[s].last - 1].carry_out;
    for (int64_t i = low[s]; i < carry_out; ++i) {
      size_t t = s + 1;
      while (low[t] > i) ++t;
      routes[s].push_back({static_cast<int64_t>(t), i - low[t]});
    }
  }
  return routes;
}

RemoteUnet RemoteUnet::create(int64_t depth, int64_t classes, const std::vector<StagePlan>& plan,
                              int64_t seed, bool freeze_batchnorm) {
  RemoteUnet net;
  net.routes_ = routes_of(depth, plan);  // before any worker builds anything
  remote_module::check_routes(net.routes_, plan.size());
  net.depth_ = depth;
  net.classes_ = classes;
  for (const StagePlan& stage : plan) {
    remote_module::StageConfig config = remote_module::stage_config();
    config.insert("depth", depth);
    config.insert("classes", classes);
    config.insert("first", stage.first);
    config.insert("last", stage.last);
    config.insert("seed", seed);
    config.insert("freeze_batchnorm", int64_t{freeze_batchnorm ? 1 : 0});
    remote_module::RemoteModule module =
        remote_module::RemoteModule::create(stage.worker, "unet.blocks", config);
    if (!stage.device.empty()) {
      try {
        module.to(stage.device);
      } catch (const rpc::Error& e) {
        throw e.restated(fmt::format("placing stage \"{}\" on {}/{}: {}", stage.name, stage.worker,
                                     stage.device, e.what()));
      }
    }
    net.stages_.push_back({stage, std::move(module)});
  }
  return net;
}

RemoteUnet RemoteUnet::create(int64_t depth, int64_t classes,
                              const std::array<std::string, 3>& workers, int64_t seed) {
  return create(depth, classes, seams(depth, workers), seed);
}

at::Tensor RemoteUnet::loss(const at::Tensor& images, const at::Tensor& masks,
                            const std::string& loss) {
  auto start = std::chrono::steady_clock::now();
  at::Tensor value =
      remote_module::RemoteModule::loss_chain(modules(), {images}, routes_, loss, masks);
  stages_.front().forward_s +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return value;
}

at::Tensor RemoteUnet::forward(const at::Tensor& images, bool direct) {
  if (direct) {
    auto start = std::chrono::steady_clock::now();
    at::Tensor out =
        remote_module::RemoteModule::forward_chain(modules(), {images}, routes_).toTensor();
    stages_.front().forward_s +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
  }
  // Each stage's outputs stay here until the stage they are routed to takes them.
  std::vector<std::vector<at::Tensor>> outputs(stages_.size());
  c10::IValue value = images;
  for (size_t s = 0; s < stages_.size(); ++s) {
    if (s > 0) {
      std::vector<at::Tensor> inputs(
          static_cast<size_t>(remote_module::routed_input_size(routes_, static_cast<int64_t>(s))));
      for (size_t p = 0; p < s; ++p) {
        for (size_t q = 0; q < routes_[p].size(); ++q) {
          if (routes_[p][q].stage != static_cast<int64_t>(s)) continue;
          inputs.at(static_cast<size_t>(routes_[p][q].position)) = std::move(outputs[p].at(q));
        }
      }
      value = c10::List<at::Tensor>(std::move(inputs));
    }
    auto start = std::chrono::steady_clock::now();
    value = stages_[s].module.forward({value});
    stages_[s].forward_s +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s + 1 < stages_.size()) outputs[s] = value.toTensorVector();
  }
  return value.toTensor();
}

void RemoteUnet::train(bool on) {
  for (Stage& stage : stages_) stage.module.train(on);
}

std::vector<rpc::RRefPtr> RemoteUnet::parameters() const {
  std::vector<rpc::RRefPtr> all;
  for (const Stage& stage : stages_) {
    for (auto& p : stage.module.remote_parameters()) all.push_back(p);
  }
  return all;
}

remote_module::NamedStages RemoteUnet::named() const {
  remote_module::NamedStages out;
  for (const Stage& stage : stages_) out.emplace_back(stage.name(), stage.module);
  return out;
}

std::vector<remote_module::RemoteModule> RemoteUnet::modules() const {
  std::vector<remote_module::RemoteModule> out;
  for (const Stage& stage : stages_) out.push_back(stage.module);
  return out;
}

Unet RemoteUnet::local_copy() const { return local_from(stage_states()); }

std::vector<c10::Dict<std::string, at::Tensor>> RemoteUnet::stage_states() const {
  std::vector<c10::Dict<std::string, at::Tensor>> out;
  for (const Stage& stage : stages_) out.push_back(stage.module.state_dict());
  return out;
}

Unet RemoteUnet::local_from(const std::vector<c10::Dict<std::string, at::Tensor>>& states) const {
  Unet net(depth_, classes_);
  c10::Dict<std::string, at::Tensor> state;
  for (const auto& part : states) {
    for (const auto& entry : part) state.insert(entry.key(), entry.value());
  }
  LoadReport report = load_state_dict(*net, state);
  if (!report.ok()) {
    throw std::runtime_error("copying the stages into a local U-Net: " + report.describe());
  }
  return net;
}

LoadReport RemoteUnet::load_weights(const std::string& path) {
  return load_state(read_weights(path));
}

LoadReport RemoteUnet::load_state(const c10::Dict<std::string, at::Tensor>& state) {
  bool whole = false;
  for (const auto& entry : state) {
    for (const char* prefix : {"encoder.", "decoder.", "segmentation_head."}) {
      whole |= entry.key().rfind(prefix, 0) == 0;
    }
  }
  // The stages' own tensors, fetched once: the local model starts from them, and their names say
  // which of the loaded tensors go back to which stage.
  const std::vector<c10::Dict<std::string, at::Tensor>> states = stage_states();
  Unet local = local_from(states);
  LoadReport report = load_state_dict(*local, state, whole ? "" : "encoder.");
  c10::Dict<std::string, at::Tensor> loaded;
  for (const auto& named : {local->named_parameters(true), local->named_buffers(true)}) {
    for (const auto& item : named) loaded.insert(item.key(), item.value());
  }
  for (size_t k = 0; k < stages_.size(); ++k) {
    c10::Dict<std::string, at::Tensor> part;
    for (const auto& entry : states[k]) part.insert(entry.key(), loaded.at(entry.key()));
    stages_[k].module.load_state_dict(part);
  }
  return report;
}

}  // namespace ferry::models
