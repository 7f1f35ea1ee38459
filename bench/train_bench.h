// `ferry-bench train`: the training job itself (ferry-launch, ferry-master train) with R replicas
// against one, at the same images per replica and step (or, with --same-global-batch, one copy
// on all R replicas' images), in one run: the step time, the throughput, the all-reduce's
// exposed time (what the replicas add to the optimizer's calls: from the end of the backward to
// the step) and its share of a step, each stage's worker peak, and how the gradient buckets
// went; and one replica under bf16-mixed against float32: the step time and the bytes every
// process sends per step.
#pragma once

#include <string>

namespace ferry::bench {

struct TrainBenchSettings {
  std::string model = "unet-resnet18";
  int replicas = 2;
  int batch = 4;  // images per replica and step
  int image_size = 64;
  int steps = 12;   // timed steps of each run (one epoch); an untimed epoch goes first
  int repeats = 3;  // runs of each configuration, alternating; medians are reported
  int stages = 2;   // 1: the whole model on each replica's one worker
  std::string partition = "decoder.0";  // two stages: the encoder, then decoder and head
  bool same_global_batch = false;       // the one copy takes every replica's images per step
  double bucket_mib = 25;
  bool bf16 = true;                                     // also one replica under bf16-mixed
  std::string log_file = "/tmp/ferry-bench-train.log";  // the jobs' own output
  std::string self_path;
};

// Prints one JSON object last. Returns the exit code.
int run_train_bench(const TrainBenchSettings& settings);

}  // namespace ferry::bench
