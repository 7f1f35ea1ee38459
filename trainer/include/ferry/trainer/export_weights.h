// ferry-master export: a trained model out of its checkpoint, as one state dict that Python's
// segmentation_models_pytorch loads (`smp.Unet(...).load_state_dict(torch.load(path))`).
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "ferry/core/image_size.h"
#include "ferry/data/dataset.h"
#include "ferry/remote_module/checkpoint.h"

namespace ferry::trainer {

// The checkpoint folder of epoch `epoch` in `dir`, or else in `dir/best` (--save-best's); with
// epoch 0, the latest of `dir`. Throws rpc::Error(InvalidArgument) naming the directory and the
// epochs it keeps.
std::string checkpoint_of_epoch(const std::string& dir, int epoch);

// The segmentation_models_pytorch call that builds the model `state` belongs to
// ('smp.Unet("resnet34", encoder_weights=None, classes=1)'), read from its tensors' names and
// shapes; empty when they are not a U-Net with a ResNet encoder.
std::string smp_model_of(const c10::Dict<std::string, at::Tensor>& state);

struct ExportSettings {
  std::string checkpoint_dir;
  int epoch = 0;  // 0: the latest checkpoint
  std::string out;
};

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

// Writes the chosen checkpoint's stages as one state dict to `out` and says what it wrote; and
// beside it, in about_path(out), a JSON object of the smp model to load it into ("model"), how
// its inputs were normalised in training ("normalize": {"mean": [3], "std": [3]}) and the size
// they were brought to ("input": {"height", "width", "resize"}), for predict and for Python.
// Returns the exit code.
int export_weights(const ExportSettings& settings);

// The JSON file beside an export: OUT with the extension .json.
std::string about_path(const std::string& weights);
// What the JSON beside `weights` records, if there is one; throws rpc::Error(InvalidArgument)
// naming the file when it is there but malformed.
TrainedInputs recorded_inputs(const std::string& weights);

}  // namespace ferry::trainer
