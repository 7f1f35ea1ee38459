// Memory for tensors that arrive over the wire.
//
// On first touch every fresh page costs a fault (on virtual machines around 10 us per 4 KiB
// page), and the kernel touches them while it copies socket data in: a 64 MiB tensor read into
// fresh memory ran at a tenth of loopback bandwidth. Large receive buffers therefore come from a
// bounded cache of blocks that earlier received tensors released, backed by transparent huge
// pages where the kernel allows. Small tensors use LibTorch's ordinary CPU allocator.
//
// Thread rules: allocate from any thread; the memory may be released on any thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>

namespace ferry::rpc {

// A new, uninitialised CPU tensor whose storage comes from the receive cache. It behaves as any
// tensor (resizable, freed when the last reference goes).
at::Tensor empty_for_receive(c10::IntArrayRef shape, c10::ScalarType dtype);

// Bytes held in the cache, free for reuse (for tests and diagnostics).
std::size_t receive_cache_bytes();

}  // namespace ferry::rpc
