// The U-Net cut into its three stages, each a RemoteModule on a worker, driven from this process:
// the forward pass calls encoder, decoder and head one after the other.
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
  static constexpr std::array<const char*, 3> kStageNames = {"encoder", "decoder", "head"};
  static constexpr std::array<const char*, 3> kStageTypes = {"unet.encoder", "unet.decoder",
                                                             "unet.head"};
  // The one-process Unet's submodule that each stage corresponds to.
  static constexpr std::array<const char*, 3> kLocalPrefixes = {"encoder.", "decoder.",
                                                                "segmentation_head."};

  struct Stage {
    std::string name;
    RemoteModule module;
    double forward_s = 0;  // its forward calls as this process saw them, network included
  };

  // Builds encoder, decoder and head on workers[0..2]; stage k is seeded with seed + k.
  static RemoteUnet create(int64_t depth, int64_t classes,
                           const std::array<std::string, 3>& workers, int64_t seed = 0);

  // With `direct`, activations go from worker to worker (RemoteModule::forward_chain) and only
  // `forward_s` of the first stage is counted, for the whole chain; else this process calls each
  // stage in turn and passes the activations on.
  at::Tensor forward(const at::Tensor& images, bool direct = false);
  void train(bool on = true);
  // Every stage's parameters in stage order, each stage's in its own order: the same order as
  // a local Unet's parameters().
  std::vector<rpc::RRefPtr> parameters() const;
  NamedStages named() const;
  // A one-process Unet holding exactly the stages' current parameters and buffers.
  Unet local_copy() const;
  // Loads a weights file (see read_weights) into the stages: names of a whole U-Net
  // ("encoder.", "decoder.", "segmentation_head.") or, if none has those, of the encoder alone
  // (a torchvision ResNet). What did not fit is reported; what did is loaded.
  LoadReport load_weights(const std::string& path);

  int64_t depth() const { return depth_; }
  int64_t classes() const { return classes_; }
  const std::vector<Stage>& stages() const { return stages_; }

 private:
  int64_t depth_ = 0;
  int64_t classes_ = 0;
  std::vector<Stage> stages_;
};

}  // namespace ferry::models
