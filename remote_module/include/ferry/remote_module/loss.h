// Losses by name. A stage that computes the loss where the logits are (a pipeline's last stage)
// cannot be sent code, so it looks its loss up here, as it looks up its stage type. Built in:
// "bce", "dice" and "bce+dice" (binary segmentation: logits and masks of the same shape, the mean
// over the batch's pixels) and "mse", each computed in float32 whatever the output's type. A
// user's own loss is
// registered by the programs that serve it (its workers, and the master where it computes the
// loss itself), or from a stage plugin with FERRY_REGISTER_LOSS. Safe from any thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "ferry/remote_module/stage.h"

namespace ferry::remote_module {

// A scalar: the mean over the samples of `output` (so that micro-batches' losses, weighted by
// their share of the batch, add up to the batch's).
using LossFunction = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

// Throws rpc::Error(InvalidArgument) if `name` is taken.
void register_loss(const std::string& name, LossFunction loss);
std::vector<std::string> registered_losses();
// Throws rpc::Error(InvalidArgument) listing the registered losses if `name` is unknown.
LossFunction loss_function(const std::string& name);
// `loss` (registered as `name`) of `output` against `target`, as a 0-dim tensor; throws
// rpc::Error(InvalidArgument) naming the loss if it returns anything but one value.
at::Tensor scalar_loss(const std::string& name, const LossFunction& loss, const at::Tensor& output,
                       const at::Tensor& target);

namespace detail {
// As register_stage_at_load: a clash while a plugin loads is reported by the loader.
void register_loss_at_load(const std::string& name, LossFunction loss);
struct LossRegistration {
  LossRegistration(const std::string& name, LossFunction loss) {
    register_loss_at_load(name, std::move(loss));
  }
};
}  // namespace detail

}  // namespace ferry::remote_module

// Registers a loss at start-up, or when the plugin holding it loads:
// FERRY_REGISTER_LOSS("focal", focal_loss);
#define FERRY_REGISTER_LOSS(name, loss)                                                   \
  static ::ferry::remote_module::detail::LossRegistration FERRY_STAGE_CONCAT(ferry_loss_, \
                                                                             __LINE__)(name, loss)
