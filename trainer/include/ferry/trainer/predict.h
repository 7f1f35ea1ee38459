// ferry-master predict: masks for a folder of images from trained weights, split over the world's
// workers (or in this one process when it runs on its own), with IoU and Dice where masks exist.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ferry/core/image_size.h"
#include "ferry/data/dataset.h"

namespace ferry::trainer {

struct PredictSettings {
  std::string model = "unet-resnet34";
  int64_t classes = 1;
  // Every image is brought to this size as `resize` says, its mask taken back to the image's own.
  // Empty: as the weights' training recorded, else 128 and pad.
  std::optional<core::ImageSize> image_size;
  std::optional<data::Resize> resize;
  std::string weights;         // a weights file (an export, torch.save or TorchScript) ...
  std::string checkpoint_dir;  // ... or a checkpoint directory, at `epoch` (0: the latest)
  int epoch = 0;
  std::string data;  // DIR/images/* (masks in DIR/masks/*, if any), or the images in DIR
  // One PNG mask per image, OUT/NAME.png (0 and 255 with one class, class ids with more), and
  // OUT/metrics.csv.
  std::string out;
  double threshold = 0.5;               // one class: foreground above this probability
  std::optional<int64_t> ignore_index;  // mask pixels that count in no figure
  // How images are normalised (data::Normalization::parse); empty: as the weights' training
  // recorded (in the checkpoint, or in the JSON export writes beside its file), else imagenet.
  std::string normalize;
  bool overlay = false;  // also OUT/NAME.overlay.png: the image with its mask coloured over it
  int64_t batch_size = 8;
  std::string secret_file;
  std::string device = "auto";  // where the worker ranks' stages compute (serve_as_worker)
};

// The overlap of a predicted mask with the true one. Value type.
struct Overlap {
  double intersection = 0, predicted = 0, truth = 0;
  void add(const Overlap& other);
  // Both are 1 where neither mask has any foreground.
  double iou() const;
  double dice() const;
};

// Counts the overlap of two masks of 0 and 1 of one shape.
Overlap overlap_of(const at::Tensor& predicted, const at::Tensor& truth);

// Runs as one rank of the world the environment describes, or on its own. Returns the exit
// code; bad settings and files are rpc::Error(InvalidArgument) or std::invalid_argument naming
// the flag or file.
int run_prediction(const PredictSettings& settings);

}  // namespace ferry::trainer
