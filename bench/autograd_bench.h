// `ferry-bench autograd`: one training step (forward, distributed backward, optimizer step) of
// the U-Net split into encoder, decoder and head on three ferry-worker processes, against the
// same model trained in this process, same batch, same weights, in the same run.
#pragma once

#include <string>

namespace ferry::bench {

struct AutogradBenchSettings {
  int depth = 34;
  int batch = 4;
  int image_size = 128;
  int steps = 10;   // timed steps of each kind; medians are reported
  int warmup = 2;   // untimed steps of each kind first
  int threads = 0;  // intra-op threads of every process (0: as many as cores)
  std::string self_path;
};

// Runs as rank 0 with three workers it starts; prints one JSON object last. Returns the exit code.
int run_autograd_bench(const AutogradBenchSettings& settings);

}  // namespace ferry::bench
