// A stage plugin as a user writes one: Ferry's headers and LibTorch, none of Ferry's libraries.
// "test.plugin.scale" {factor} multiplies its input by a trainable scale that starts at factor;
// the loss "test.plugin.l1" is the mean absolute difference.
#include <ATen/ATen.h>

#include "ferry/remote_module/loss.h"
#include "ferry/remote_module/stage.h"

namespace {

class ScaleStage final : public ferry::remote_module::Stage {
 public:
  explicit ScaleStage(double factor) : scale_(at::full({1}, factor).set_requires_grad(true)) {}
  c10::IValue forward(std::vector<c10::IValue> inputs) override {
    return inputs.at(0).toTensor() * scale_;
  }
  ferry::remote_module::NamedTensors named_parameters() override { return {{"scale", scale_}}; }
  ferry::remote_module::NamedTensors named_buffers() override { return {}; }
  void train(bool on) override { training_ = on; }
  bool is_training() override { return training_; }
  void to(const c10::Device& device) override {
    scale_ = scale_.detach().to(device).set_requires_grad(true);
  }

 private:
  at::Tensor scale_;
  bool training_ = true;
};

std::unique_ptr<ferry::remote_module::Stage> make_scale(
    const ferry::remote_module::StageConfig& config) {
  return std::make_unique<ScaleStage>(ferry::remote_module::config_double(config, "factor", 1.0));
}

FERRY_REGISTER_STAGE("test.plugin.scale", make_scale);

at::Tensor l1(const at::Tensor& output, const at::Tensor& target) {
  return (output - target).abs().mean();
}

FERRY_REGISTER_LOSS("test.plugin.l1", l1);

}  // namespace
