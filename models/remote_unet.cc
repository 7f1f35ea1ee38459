#include "ferry/models/remote_unet.h"

#include <chrono>
#include <stdexcept>

#include "ferry/models/weights.h"

namespace ferry::models {

RemoteUnet RemoteUnet::create(int64_t depth, int64_t classes,
                              const std::array<std::string, 3>& workers, int64_t seed) {
  resnet_channels(depth);  // an unknown depth fails here, before any worker builds anything
  RemoteUnet net;
  net.depth_ = depth;
  net.classes_ = classes;
  for (size_t k = 0; k < kStageNames.size(); ++k) {
    StageConfig config = stage_config();
    config.insert("depth", depth);
    config.insert("classes", classes);
    config.insert("seed", seed + static_cast<int64_t>(k));
    net.stages_.push_back(
        {kStageNames[k], RemoteModule::create(workers[k], kStageTypes[k], config)});
  }
  return net;
}

at::Tensor RemoteUnet::forward(const at::Tensor& images, bool direct) {
  if (direct) {
    std::vector<RemoteModule> modules;
    for (const Stage& stage : stages_) modules.push_back(stage.module);
    auto start = std::chrono::steady_clock::now();
    at::Tensor out = RemoteModule::forward_chain(modules, {images}).toTensor();
    stages_.front().forward_s +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
  }
  c10::IValue value = images;
  for (Stage& stage : stages_) {
    auto start = std::chrono::steady_clock::now();
    value = stage.module.forward({value});
    stage.forward_s +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

NamedStages RemoteUnet::named() const {
  NamedStages out;
  for (const Stage& stage : stages_) out.emplace_back(stage.name, stage.module);
  return out;
}

Unet RemoteUnet::local_copy() const {
  Unet net(depth_, classes_);
  for (size_t k = 0; k < stages_.size(); ++k) {
    LoadReport report = load_state_dict(*net, stages_[k].module.state_dict(), kLocalPrefixes[k]);
    if (!report.ok()) {
      throw std::runtime_error("copying stage \"" + stages_[k].name +
                               "\" into a local U-Net: " + report.describe());
    }
  }
  return net;
}

LoadReport RemoteUnet::load_weights(const std::string& path) {
  c10::Dict<std::string, at::Tensor> state = read_weights(path);
  bool whole = false;
  for (const auto& entry : state) {
    for (const char* prefix : kLocalPrefixes) whole |= entry.key().rfind(prefix, 0) == 0;
  }
  Unet local = local_copy();
  LoadReport report = load_state_dict(*local, state, whole ? "" : kLocalPrefixes[0]);
  for (size_t k = 0; k < stages_.size(); ++k) {
    const std::string prefix = kLocalPrefixes[k];
    c10::Dict<std::string, at::Tensor> part;
    for (const auto& named : {local->named_parameters(true), local->named_buffers(true)}) {
      for (const auto& item : named) {
        if (item.key().rfind(prefix, 0) == 0) {
          part.insert(item.key().substr(prefix.size()), item.value());
        }
      }
    }
    stages_[k].module.load_state_dict(part);
  }
  return report;
}

}  // namespace ferry::models
