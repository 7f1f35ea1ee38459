#include "ferry/remote_module/loss.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <map>
#include <mutex>

#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"

namespace ferry::remote_module {
namespace {

at::Tensor bce(const at::Tensor& logits, const at::Tensor& masks) {
  // In float32 whatever the stages computed in: bfloat16 logits lose too much in a mean.
  return torch::binary_cross_entropy_with_logits(logits.to(at::kFloat), masks.to(at::kFloat));
}

at::Tensor dice(const at::Tensor& logits, const at::Tensor& masks) {
  at::Tensor p = torch::sigmoid(logits.to(at::kFloat));
  at::Tensor m = masks.to(at::kFloat);
  return 1 - (2 * (p * m).sum() + 1) / (p.sum() + m.sum() + 1);
}

at::Tensor mse(const at::Tensor& output, const at::Tensor& target) {
  return torch::mse_loss(output.to(at::kFloat), target.to(at::kFloat));
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, LossFunction> losses{
      {"bce", bce},
      {"dice", dice},
      {"mse", mse},
      {"bce+dice",
       [](const at::Tensor& logits, const at::Tensor& masks) {
         return bce(logits, masks) + dice(logits, masks);
       }},
  };
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: losses may register during static init
  return *r;
}

}  // namespace

void register_loss(const std::string& name, LossFunction loss) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.losses.emplace(name, std::move(loss)).second) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("loss \"{}\" is already registered", name));
  }
}

std::vector<std::string> registered_losses() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& entry : r.losses) out.push_back(entry.first);
  return out;
}

LossFunction loss_function(const std::string& name) {
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.losses.find(name);
    if (it != r.losses.end()) return it->second;
  }
  throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                   fmt::format("unknown loss \"{}\" on worker \"{}\" (registered: {})", name,
                               rpc::is_initialized() ? rpc::self().name : "this process",
                               fmt::join(registered_losses(), ", ")));
}

at::Tensor scalar_loss(const std::string& name, const LossFunction& loss, const at::Tensor& output,
                       const at::Tensor& target) {
  at::Tensor value = loss(output, target);
  if (!value.defined() || value.numel() != 1) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("the loss \"{}\" must return a scalar, not a tensor of shape {}",
                                 name, value.defined() ? c10::str(value.sizes()) : "()"));
  }
  return value.reshape({});
}

}  // namespace ferry::remote_module
