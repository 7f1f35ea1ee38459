// Batch statistics over a whole step. A layer that normalises by its batch's statistics (a batch
// norm) sees, in one forward, only what that forward carries: one replica's share of the step,
// one micro-batch of a pipelined step. A layer that implements StepStatistics can instead take
// the normalisation statistics over every replica of its stage (summed across them), and update
// its running statistics once per step from all of its micro-batches, as torchgpipe's deferred
// batch norm does.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace ferry::remote_module {

// Replaces each tensor by its sum over the replicas of the stage. Every replica calls it with
// tensors of the same shapes, in the same order.
using SumOverReplicas = std::function<void(std::vector<at::Tensor>&)>;

// What the forward running on this thread is part of. The pipeline's stage runtime says so for
// each micro-batch; anywhere else it is {0, false}: each forward is a step of its own.
struct ForwardPass {
  std::int64_t step = 0;   // the step's autograd context, 0 when not known
  bool recompute = false;  // recomputing a forward that already ran, for its backward
};

const ForwardPass& current_forward_pass();

// Sets the current forward pass of this thread for its lifetime.
class ForwardPassScope {
 public:
  explicit ForwardPassScope(ForwardPass pass);
  ~ForwardPassScope();
  ForwardPassScope(const ForwardPassScope&) = delete;
  ForwardPassScope& operator=(const ForwardPassScope&) = delete;

 private:
  ForwardPass previous_;
};

class StepStatistics {
 public:
  virtual ~StepStatistics() = default;
  // From now on the layer's training forwards take their statistics over the step: summed with
  // `sum` over the replicas (none when empty), and its running statistics updated once per step
  // from every micro-batch, not by a recomputation.
  virtual void take_step_statistics(SumOverReplicas sum) = 0;
};

}  // namespace ferry::remote_module
