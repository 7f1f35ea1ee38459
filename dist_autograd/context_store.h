// The per-process table of autograd contexts: what each context recorded here (send functions,
// the workers it reached, accumulated gradients). Internal to dist_autograd/.
//
// Thread rules: every function and every ContextState member function is safe from any thread.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/edge.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ferry::dist_autograd {

// The sender's half of one recorded RPC: where the gradients of the tensors it sent go.
struct SendFunction {
  std::vector<torch::autograd::Edge> edges;  // one per tensor that required grad, in message order
  int to_rank = -1;
};

class ContextState {
 public:
  explicit ContextState(std::int64_t id) : id_(id) {}
  std::int64_t id() const { return id_; }

  void add_send(std::int64_t message_id, SendFunction send);
  // Throws rpc::Error(InvalidArgument) if there is no such send function.
  SendFunction send(std::int64_t message_id) const;
  // Every send function recorded here, by message id.
  std::vector<std::pair<std::int64_t, SendFunction>> sends() const;
  // The roots of backward() calls made here on this context.
  void add_roots(const std::vector<torch::autograd::Edge>& roots);
  std::vector<torch::autograd::Edge> roots() const;
  void add_worker(int rank);
  std::set<int> workers() const;

  // Adds `grad` to the gradient of leaf `variable`: out of place, as `grad` may alias a buffer
  // the engine still uses, unless `handed_over` says the caller gives `grad` up. Once the
  // context holds a sum of its own, further gradients are added into it in place. A leaf with a
  // gradient sink (gradient_sink.h) sends `grad` there instead; the context only remembers it.
  void accumulate(const at::Tensor& variable, const at::Tensor& grad, bool handed_over = false);
  // The accumulated gradient of `variable`, undefined if none (a sunk leaf's: what its sink holds).
  at::Tensor gradient(const at::Tensor& variable) const;
  std::vector<std::pair<at::Tensor, at::Tensor>> gradients() const;

 private:
  const std::int64_t id_;
  mutable std::mutex mutex_;
  std::unordered_map<std::int64_t, SendFunction> sends_;
  std::vector<torch::autograd::Edge> roots_;
  std::set<int> workers_;
  struct Gradient {
    at::Tensor variable;
    at::Tensor sum;
    bool own = false;  // nothing outside the context holds `sum`
  };
  std::unordered_map<const void*, Gradient> gradients_;
  std::unordered_map<const void*, at::Tensor> sunk_;  // leaves whose gradients went to a sink
};

using ContextPtr = std::shared_ptr<ContextState>;

// A new id for a context or a message, unique in the world: this rank in the high bits.
std::int64_t next_id();

// Opens a new context here.
ContextPtr create_context();
// The context, made on first contact from another worker; nullptr for one released recently
// (a straggling message must not bring it back).
ContextPtr join_context(std::int64_t id);
// The context, or nullptr.
ContextPtr find_context(std::int64_t id);
// Throws rpc::Error(InvalidArgument) naming the id and this worker if it is unknown.
ContextPtr context_or_throw(std::int64_t id, const char* what);
// Forgets the context here; returns it (nullptr if it was unknown) so the caller can reach the
// workers it touched.
ContextPtr erase_context(std::int64_t id);
std::size_t live_contexts();

// This worker's name for error messages ("this process" before rpc::init).
std::string self_name();

// The context current on this thread (0: none).
std::int64_t current_id();
void set_current_id(std::int64_t id);

}  // namespace ferry::dist_autograd
