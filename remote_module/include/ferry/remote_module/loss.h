// Losses by name. A stage that computes the loss where the logits are (a pipeline's last stage)
// cannot be sent code, so it looks its loss up here, as it looks up its stage type. A loss
// travels as a LossSpec's text: its name and the options of the built-in segmentation losses.
//
// Built in, each computed in float32 whatever the output's type, as segmentation_models_pytorch's
// `losses` module defines them:
//   one logit per pixel (binary: targets of 0 and 1 of the logits' shape): "bce", "dice" and
//   "bce+dice" (the mean over the batch's pixels), "focal";
//   K > 1 logits per pixel (targets of class ids, [B, H, W] or [B, 1, H, W]): "ce"
//   (cross-entropy, with class weights), "dice" and "focal" (smp's mode="multiclass"), "ce+dice";
//   "mse" of any shape.
// "dice" and "focal" take their mode from the logits' channels. Every segmentation loss leaves
// pixels of the ignore index out. A user's own loss is registered by the programs that serve it
// (its workers, and the master where it computes the loss itself), or from a stage plugin with
// FERRY_REGISTER_LOSS; it takes no options. Safe from any thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ferry/remote_module/stage.h"

namespace ferry::remote_module {

// A scalar: the mean over the samples of `output` (so that micro-batches' losses, weighted by
// their share of the batch, add up to the batch's).
using LossFunction = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

// What the built-in segmentation losses take besides logits and targets. Value type.
struct LossOptions {
  // Target pixels of this value count in no loss (VOC's 255 borders).
  std::optional<std::int64_t> ignore_index;
  // The cross-entropy's weight of each class (torch's `weight`); empty: all 1.
  std::vector<double> class_weights;
  bool empty() const { return !ignore_index && class_weights.empty(); }
  bool operator==(const LossOptions& other) const {
    return ignore_index == other.ignore_index && class_weights == other.class_weights;
  }
};

// A loss by name with its options, and as the one string that carries it to a stage:
// "ce;ignore_index=255;class_weights=0.5,1,2" (doubles written to round-trip exactly). Value type.
struct LossSpec {
  std::string name;
  LossOptions options;
  std::string to_string() const;
  // Throws rpc::Error(InvalidArgument) naming the part of `text` that is wrong.
  static LossSpec parse(const std::string& text);
};

// Throws rpc::Error(InvalidArgument) if `name` is taken.
void register_loss(const std::string& name, LossFunction loss);
std::vector<std::string> registered_losses();
// The loss a LossSpec's text names, with its options. Throws rpc::Error(InvalidArgument) listing
// the registered losses if its name is unknown, and naming the option where the loss takes none.
LossFunction loss_function(const std::string& spec);
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
// FERRY_REGISTER_LOSS("lovasz", lovasz_loss);
#define FERRY_REGISTER_LOSS(name, loss)                                                   \
  static ::ferry::remote_module::detail::LossRegistration FERRY_STAGE_CONCAT(ferry_loss_, \
                                                                             __LINE__)(name, loss)
