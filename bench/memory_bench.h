// `ferry-bench memory`: what a split buys in memory. The whole U-Net trains one step in one
// process; the same model cut into N stages balanced by memory trains one step under three
// settings (naive, 1F1B, 1F1B with activations recomputed), and each stage's worker reports its
// peak of tensor memory as its allocator counts it. Then, with every process held to a budget
// equal to the single process's peak at the base batch (--memory-budget-mib, the CPU stand-in for
// a device's memory), the largest batch that trains a real step is searched for, in one process
// and over the N stages: doubling, then bisection. Every measurement is a fresh process (a
// ferry-master footprint or a ferry-launch world), so nothing of one leaks into the next.
#pragma once

#include <string>

#include "ferry/trainer/settings.h"

namespace ferry::bench {

struct MemoryBenchSettings {
  int depth = 152;
  int image_size = 64;
  int batch = 8;  // the base batch: the single process's peak at it is the budget
  int stages = 4;
  int microbatches = 4;
  int max_batch = 256;  // the search stops here
  int resolution = 4;   // the bisection stops when the bounds are this close
  trainer::Optimizer optimizer = trainer::Optimizer::Adam;
  std::string self_path;
};

int run_memory_bench(const MemoryBenchSettings& settings);

}  // namespace ferry::bench
