// The U-Net cut into stages, each a range of its blocks (unet_blocks.h) held by a RemoteModule
// on a worker, driven from this process: the forward pass runs the stages one after the other.
// Tensor names are the whole model's in every stage, so weights and checkpoints fit any cut.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/models/unet.h"
#include "ferry/models/weights.h"
#include "ferry/remote_module/checkpoint.h"
#include "ferry/remote_module/remote_module.h"

namespace ferry::models {

class RemoteUnet {
 public:
  // Where one stage goes: blocks [first, last) on `worker`, on its `device` ("cuda:0"; empty:
  // the worker's CPU). Value type.
  struct StagePlan {
    std::string name;
    int64_t first = 0;
    int64_t last = 0;
    std::string worker;
    std::string device;
  };

  // The U-Net's three natural parts: "encoder" (stem to the last block of layer4), "decoder"
  // (its five blocks) and "head", on workers[0..2].
  static std::vector<StagePlan> seams(int64_t depth, const std::array<std::string, 3>& workers);

  // Builds every stage of `plan` on its worker (and device). The ranges must cover the blocks in
  // order without gaps and the names must differ: otherwise std::invalid_argument naming the
  // stage, before anything is built. A device the worker lacks is an error naming the stage.
  // With `freeze_batchnorm`, every stage's batch norms keep their statistics and affine
  // parameters (UnetBlocksImpl::freeze_batchnorm).
  static RemoteUnet create(int64_t depth, int64_t classes, const std::vector<StagePlan>& plan,
                           int64_t seed = 0, bool freeze_batchnorm = false);
  // The three seams on `workers`.
  static RemoteUnet create(int64_t depth, int64_t classes,
                           const std::array<std::string, 3>& workers, int64_t seed = 0);

  struct Stage {
    StagePlan plan;
    remote_module::RemoteModule module;
    double forward_s = 0;  // its forward calls as this process saw them, network included
    const std::string& name() const { return plan.name; }
  };

  // With `direct`, activations go from worker to worker (RemoteModule::forward_chain) and only
  // `forward_s` of the first stage is counted, for the whole chain; else this process calls each
  // stage in turn and passes the activations on. Either way a stage gets only the part of the
  // carry its blocks use: each skip feature goes from the stage that makes it to the one that
  // uses it, not through the stages between (routes()).
  at::Tensor forward(const at::Tensor& images, bool direct = false);
  // The loss registered as `loss` (remote_module/loss.h) of the forward from worker to worker,
  // computed on the last stage's worker against `masks` (RemoteModule::loss_chain): the logits
  // stay there, only the scalar comes here.
  at::Tensor loss(const at::Tensor& images, const at::Tensor& masks, const std::string& loss);
  void train(bool on = true);
  // Every stage's parameters in stage order: the same order as a local Unet's parameters(),
  // whatever the cut.
  std::vector<rpc::RRefPtr> parameters() const;
  remote_module::NamedStages named() const;
  std::vector<remote_module::RemoteModule> modules() const;
  // A one-process Unet holding exactly the stages' current parameters and buffers.
  Unet local_copy() const;
  // Loads a weights file (see read_weights) into the stages: names of a whole U-Net
  // ("encoder.", "decoder.", "segmentation_head.") or, if none has those, of the encoder alone
  // (a torchvision ResNet). What did not fit is reported; what did is loaded.
  LoadReport load_weights(const std::string& path);
  // The same for tensors already read (a weights file, a checkpoint's merged stages).
  LoadReport load_state(const c10::Dict<std::string, at::Tensor>& state);

  // Where each element of each stage's output goes (portal.h): the activation to the next stage,
  // each skip feature to the stage whose blocks use it. Pipelines over modules() take them too.
  const remote_module::Routes& routes() const { return routes_; }
  // The routes of `plan` (checked as create() does).
  static remote_module::Routes routes_of(int64_t depth, const std::vector<StagePlan>& plan);

  int64_t depth() const { return depth_; }
  int64_t classes() const { return classes_; }
  const std::vector<Stage>& stages() const { return stages_; }

 private:
  // Each stage's parameters and buffers, copied here.
  std::vector<c10::Dict<std::string, at::Tensor>> stage_states() const;
  Unet local_from(const std::vector<c10::Dict<std::string, at::Tensor>>& states) const;

  int64_t depth_ = 0;
  int64_t classes_ = 0;
  std::vector<Stage> stages_;
  remote_module::Routes routes_;
};

}  // namespace ferry::models
