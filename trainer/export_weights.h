// What ferry-master export (ferry/trainer/model_tools.h) and predict read of a checkpoint and
// write beside an export: the epoch's folder, the smp model the state belongs to, and how the
// model's inputs were fed in training.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "ferry/core/image_size.h"
#include "ferry/data/dataset.h"
#include "ferry/remote_module/checkpoint.h"
#include "ferry/trainer/model_tools.h"

namespace ferry::trainer {

// The checkpoint folder of epoch `epoch` in `dir`, or else in `dir/best` (--save-best's); with
// epoch 0, the latest of `dir`. Throws rpc::Error(InvalidArgument) naming the directory and the
// epochs it keeps.
std::string checkpoint_of_epoch(const std::string& dir, int epoch);

// The segmentation_models_pytorch call that builds the model `state` belongs to
// ('smp.Unet("resnet34", encoder_weights=None, classes=1)'), read from its tensors' names and
// shapes; empty when they are not a U-Net with a ResNet encoder.
std::string smp_model_of(const c10::Dict<std::string, at::Tensor>& state);

// How training fed its images to the model, as far as its checkpoint or export records it: what
// predict needs to feed the model alike. Value type.
struct TrainedInputs {
  std::optional<data::Normalization> normalization;
  std::optional<core::ImageSize> image_size;
  std::optional<data::Resize> resize;
};

// What a checkpoint records of its inputs (its values "normalize", "image_size", "resize").
// Throws rpc::Error(InvalidArgument) naming the folder when one is malformed.
TrainedInputs inputs_of(const remote_module::SavedCheckpoint& checkpoint,
                        const std::string& folder);

// The JSON file beside an export: OUT with the extension .json.
std::string about_path(const std::string& weights);
// What the JSON beside `weights` records, if there is one; throws rpc::Error(InvalidArgument)
// naming the file when it is there but malformed.
TrainedInputs recorded_inputs(const std::string& weights);

}  // namespace ferry::trainer
