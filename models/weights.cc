#include "ferry/models/weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

namespace ferry::models {

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
