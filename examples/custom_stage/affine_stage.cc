// "custom.affine" {in, out, tanh (0 or 1), seed}: a linear layer, with tanh after it if asked.
#include <ferry/remote_module/stage.h>
#include <torch/torch.h>

namespace {

std::unique_ptr<ferry::remote_module::Stage> make_affine(
    const ferry::remote_module::StageConfig& config) {
  torch::manual_seed(ferry::remote_module::config_int(config, "seed", 0));
  auto linear =
      std::make_shared<torch::nn::LinearImpl>(ferry::remote_module::config_int(config, "in"),
                                              ferry::remote_module::config_int(config, "out"));
  const bool tanh = ferry::remote_module::config_int(config, "tanh", 0) != 0;
  return std::make_unique<ferry::remote_module::ModuleStage>(
      linear, [linear, tanh](std::vector<c10::IValue>& in) {
        at::Tensor y = linear->forward(in.at(0).toTensor());
        return c10::IValue(tanh ? torch::tanh(y) : y);
      });
}

FERRY_REGISTER_STAGE("custom.affine", make_affine);

}  // namespace
