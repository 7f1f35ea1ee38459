// `ferry-bench pipeline`: naive model parallelism (one micro-batch) against GPipe, 1F1B and the
// zero-bubble schedule with
// 1, 2, 4 and 8 micro-batches, on p balanced synthetic stages, each stage's worker pinned to a
// core of its own, or on the U-Net cut at its three seams or into --stages balanced by
// --balance (measured per block, as ferry-master train does). Steps of every configuration take
// turns, so all see the same noise of this shared machine.
#pragma once

#include <string>
#include <vector>

#include "ferry/trainer/settings.h"

namespace ferry::bench {

struct PipelineBenchSettings {
  std::string model = "synthetic";  // synthetic | unet
  int stages = 0;                   // synthetic: 0 is 2; unet: 0 is the three seams
  trainer::Balance balance = trainer::Balance::Time;  // unet with --stages
  int width = 1024;                                   // synthetic: features of every layer
  int layers = 4;                                     // synthetic: layers per stage
  int batch = 128;      // samples (synthetic) or images (unet) per step
  int depth = 18;       // unet: ResNet depth of the encoder
  int image_size = 64;  // unet
  std::vector<int> microbatches = {1, 2, 4, 8};
  int steps = 5;    // timed steps of each configuration; medians are reported
  int warmup = 1;   // untimed steps of each first
  bool pin = true;  // each worker on its own core (taskset) where there are enough cores
  // unet: after the warm-up, cut the blocks anew from what the stages measured (as ferry-master
  // train --rebalance does) when that shortens the slowest stage by 5% or more.
  bool rebalance = true;
  // Where the loss is computed: "last-stage" (only its value comes to the master) or "master".
  trainer::LossPlacement loss_on = trainer::LossPlacement::LastStage;
  std::string trace_file;  // Chrome trace of the last configuration (zb, most micro-batches)
  std::string self_path;
};

int run_pipeline_bench(const PipelineBenchSettings& settings);

}  // namespace ferry::bench
