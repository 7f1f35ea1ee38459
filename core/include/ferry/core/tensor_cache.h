// Memory for large tensors: a bounded cache of blocks that freed tensors gave back.
//
// On first touch every fresh page costs a fault. glibc returns large freed blocks to the kernel
// (all blocks of a pool thread's arena once its heap empties), so a training step that frees and
// allocates the same activations again faults in every page again, and a tensor received into
// fresh memory is slowed as much (the figures: docs/benchmarks.md). Blocks of 1 MiB and more
// therefore come from this cache (2 MiB-aligned with transparent huge pages where the kernel
// allows, for blocks of 8 MiB and more); smaller ones from LibTorch's default allocator.
//
// Thread rules: allocate from any thread; the memory may be released on any thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>

#include "ferry/core/process_memory.h"

namespace ferry::core {

// Makes the cache LibTorch's CPU allocator for this process (idempotent), unless the environment
// says FERRY_TENSOR_CACHE_MIB=0. FERRY_TENSOR_CACHE_MIB sets the bound of the free bytes it
// keeps (default 2048).
void install_tensor_cache();

// A new, uninitialised CPU tensor whose storage comes from the cache whether or not it is
// installed (tensors read from the wire always are).
at::Tensor empty_cached(c10::IntArrayRef shape, c10::ScalarType dtype);

// Bytes held in the cache, free for reuse (for tests and diagnostics).
std::size_t tensor_cache_bytes();

}  // namespace ferry::core
