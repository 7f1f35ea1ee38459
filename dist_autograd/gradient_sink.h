// Where the gradients of some leaves go instead of into a context's own sums: a replicated
// optimizer's buckets, which start all-reducing them while the rest of the backward computes.
// Internal to dist_autograd/.
//
// Thread rules: the registry is safe from any thread. A sink's add() is called from whichever
// thread runs a part of the backward, concurrently with its owner's own calls.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ferry::dist_autograd {

class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // Takes one contribution `grad` of context `context_id` to leaf `variable`.
  virtual void add(std::int64_t context_id, const at::Tensor& variable, const at::Tensor& grad) = 0;
  // The sum taken for `variable` since its owner last stepped (undefined if none).
  virtual at::Tensor gradient(const at::Tensor& variable) const = 0;
};

// Sends the gradients of `variables` to `sink` until it is detached. The registry keeps a weak
// reference: the sink's owner keeps it alive.
void attach_gradient_sink(const std::vector<at::Tensor>& variables,
                          const std::shared_ptr<GradientSink>& sink);
void detach_gradient_sink(const GradientSink* sink);
// The sink of `variable`, or nullptr.
std::shared_ptr<GradientSink> gradient_sink(const at::Tensor& variable);
// Whether any sink is attached in this process (so that backward looks for sunk leaves at all).
bool has_gradient_sinks();

}  // namespace ferry::dist_autograd
