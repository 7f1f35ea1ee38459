// `ferry-bench data`: whether the loader keeps up. A folder of images (by default one it writes:
// 512 x 512 PNGs with masks of class ids) is read as training reads it (cropped, augmented,
// normalised) by the batch loader with 1 to N threads, and its images per second are set beside
// what one process's training step of the U-Net consumes at the same batch and size.
#pragma once

#include <string>

namespace ferry::bench {

struct DataBenchSettings {
  std::string data;       // DIR/images and DIR/masks; empty: a folder of written PNGs
  int images = 64;        // in the written folder
  int source_size = 512;  // of the written images
  int crop = 256;         // each image is cut to this square, as --crop trains
  int classes = 4;        // of the masks
  int max_threads = 4;    // loader threads tried: 1, 2, 4, ... up to this
  int batch = 8;          // images per batch and step
  int batches = 6;        // batches timed per measurement
  int repeats = 3;        // measurements per thread count (the median reported)
  std::string model = "unet-resnet18";
  int steps = 3;  // timed training steps (after one untimed)
};

int run_data_bench(const DataBenchSettings& settings);

}  // namespace ferry::bench
