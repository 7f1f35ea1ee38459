#include "ferry/models/weights.h"

#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>

#include "ferry/core/message_of.h"
#include "models/torch_save_reader.h"

namespace ferry::models {
namespace {

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw std::invalid_argument(fmt::format("weights file \"{}\": {}", path, what));
}

}  // namespace

c10::Dict<std::string, at::Tensor> read_weights(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) bad_file(path, fmt::format("cannot be opened ({})", std::strerror(errno)));
  file.close();
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> archive;
  try {
    archive = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const std::exception& e) {
    bad_file(path, fmt::format("is not a torch.save or TorchScript archive ({})", core::message_of(e)));
  }
  c10::Dict<std::string, at::Tensor> out;
  try {
    // TorchScript archives keep their constants apart; torch.save archives have none.
    if (archive->hasRecord("constants.pkl")) {
      torch::jit::Module module = torch::jit::load(path);
      for (const auto& p : module.named_parameters()) out.insert(p.name, p.value);
      for (const auto& b : module.named_buffers()) out.insert(b.name, b.value);
    } else {
      for (auto& [name, tensor] : read_torch_save(*archive)) out.insert(name, tensor);
    }
  } catch (const std::exception& e) {
    bad_file(path, core::message_of(e));
  }
  return out;
}

LoadReport load_weights(torch::nn::Module& module, const std::string& path,
                        const std::string& prefix) {
  return load_state_dict(module, read_weights(path), prefix);
}

std::string LoadReport::describe() const {
  std::vector<std::string> parts;
  if (!missing.empty()) parts.push_back(fmt::format("missing: {}", fmt::join(missing, ", ")));
  if (!unexpected.empty()) {
    parts.push_back(fmt::format("unexpected: {}", fmt::join(unexpected, ", ")));
  }
  if (!mismatched.empty()) {
    parts.push_back(fmt::format("shape mismatch: {}", fmt::join(mismatched, "; ")));
  }
  return parts.empty() ? "all tensors loaded" : fmt::format("{}", fmt::join(parts, "; "));
}

LoadReport load_state_dict(torch::nn::Module& module,
                           const c10::Dict<std::string, at::Tensor>& state,
                           const std::string& prefix) {
  LoadReport report;
  auto params = module.named_parameters(true);
  auto buffers = module.named_buffers(true);
  torch::NoGradGuard no_grad;
  for (const auto& entry : state) {
    std::string name = prefix + entry.key();
    at::Tensor* target = params.find(name);
    if (!target) target = buffers.find(name);
    if (!target) {
      report.unexpected.push_back(name);
    } else if (target->sizes() != entry.value().sizes()) {
      report.mismatched.push_back(
          fmt::format("{}: {} vs {}", name, target->sizes(), entry.value().sizes()));
    } else {
      target->copy_(entry.value());
      ++report.loaded;
    }
  }
  for (const auto& named : {params, buffers}) {
    for (const auto& item : named) {
      if (item.key().rfind(prefix, 0) == 0 && !state.contains(item.key().substr(prefix.size()))) {
        report.missing.push_back(item.key());
      }
    }
  }
  return report;
}

}  // namespace ferry::models
