// Each block's forward and backward time as a stage runs them, for re-cutting a running job from
// what its blocks really cost. A forward is timed at its block's boundaries. A backward is the sum
// of the autograd nodes that block's forward recorded, each timed by hooks: so a backward split
// into an input pass and deferred weight passes (pipeline/split_backward.h), or one run much
// later, still counts against the block that made it. Internal to models; thread-safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace ferry::models {

class BlockClock : public std::enable_shared_from_this<BlockClock> {
 public:
  using Block = std::function<std::vector<at::Tensor>(std::vector<at::Tensor>)>;
  explicit BlockClock(std::size_t blocks);

  // `block` (the k-th timed here) on `carry`, timed, with the nodes it recorded hooked (they hold
  // this clock, so a graph may outlive the stage that made it). Held by a shared_ptr.
  std::vector<at::Tensor> run(std::size_t k, const Block& block, std::vector<at::Tensor> carry);

  // Seconds per block so far.
  std::vector<double> forward_s() const;
  std::vector<double> backward_s() const;

  void add_backward(std::size_t k, double seconds);

 private:
  mutable std::mutex mutex_;
  std::vector<double> forward_, backward_;
};

}  // namespace ferry::models
