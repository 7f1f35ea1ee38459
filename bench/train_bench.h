// `ferry-bench train`: the training job itself (ferry-launch, ferry-master train) with R replicas
// against one, at the same images per replica and step, in one run: the step time, the
// throughput and the share of a step the optimizer's all-reduce takes; and one replica under
// bf16-mixed against float32: the step time and the bytes every process sends per step.
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
  std::string partition = "decoder.0";  // two stages: the encoder, then decoder and head
  std::string log_file = "/tmp/ferry-bench-train.log";  // the jobs' own output
  std::string self_path;
};

// Prints one JSON object last. Returns the exit code.
int run_train_bench(const TrainBenchSettings& settings);

}  // namespace ferry::bench
