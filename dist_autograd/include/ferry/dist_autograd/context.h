// Distributed autograd (mirrors torch.distributed.autograd in its FAST mode). A Context groups one
// training step: every RPC made inside it that carries tensors requiring grad, request or
// response, is recorded as a send function on the sender and a recv function on the receiver, so
// backward() can run the whole graph across processes. Gradients accumulate in the context on
// the worker that owns each parameter, never in `.grad`.
//
// Thread rules: a context is current on the thread that opened it (and on the pool thread that
// runs a request made inside it, while it runs); any thread may open its own, and several may be
// active at once. Every function may be called from any thread except an agent's loop thread.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/rpc/registry.h"
#include "ferry/rpc/rref.h"

namespace ferry::dist_autograd {

// Adds the "ferry.autograd.*" and "ferry.optim.*" functions to `registry` and hooks into rpc/.
// Every process that takes part in distributed training (master and workers) calls it before
// rpc::init(), or ferry::pipeline::install, which installs every layer's functions. A second
// call does nothing.
void install(rpc::FunctionRegistry& registry);

// One training step's autograd context. Resource type. Its id is unique in the world (the
// opening rank sits in the high bits).
class Context {
 public:
  // Opens a context and makes it current on this thread. Throws rpc::Error(InvalidArgument) if
  // this thread already has one.
  Context();
  // Releases the context here and on every worker it reached, waiting for them (bounded by the
  // RPC timeout; failures are logged, a dead worker has nothing left to free).
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  std::int64_t id() const { return id_; }

 private:
  std::int64_t id_;
};

// The context current on this thread, 0 if none.
std::int64_t current_context_id();

// Runs backward from `roots` (each a tensor requiring grad; a non-scalar root needs its gradient
// in `root_grads`, a scalar gets 1) through this process's graph and, along the recorded RPCs,
// through every worker's. Returns when every part is done. Throws rpc::Error naming the worker
// whose part failed, or that died meanwhile. With `retain_graph`, the part run here from the
// roots keeps its buffers; parts reached through RPC always keep theirs until the context is
// released, since FAST mode may enter them once per incoming gradient.
void backward(std::int64_t context_id, const std::vector<at::Tensor>& roots,
              bool retain_graph = false, const std::vector<at::Tensor>& root_grads = {});
inline void backward(const Context& context, const std::vector<at::Tensor>& roots,
                     bool retain_graph = false, const std::vector<at::Tensor>& root_grads = {}) {
  backward(context.id(), roots, retain_graph, root_grads);
}

// The gradients accumulated in this process for `context_id`, keyed by the leaf tensor.
// Throws rpc::Error(InvalidArgument) for a context this process does not know.
c10::Dict<at::Tensor, at::Tensor> get_gradients(std::int64_t context_id);
// Adds `grads[i]` to the gradient of leaf `variables[i]` in this process's part of context
// `context_id` (undefined gradients are skipped), as a backward part run here would. For engines
// of their own, such as a pipeline stage's backward per micro-batch; DistributedOptimizer then
// steps with the sum. With `handed_over`, nothing else holds or will touch `grads`, so the context
// keeps them and adds later gradients into them in place: no second copy of the gradients.
// Throws rpc::Error(InvalidArgument) for a released context or lengths that differ.
void accumulate_gradients(std::int64_t context_id, const std::vector<at::Tensor>& variables,
                          const std::vector<at::Tensor>& grads, bool handed_over = false);
// For the same engines, before they run the graph from `roots`: the leaves whose gradients a
// replicated optimizer takes as they are made (its buckets start all-reducing while the backward
// goes on) get them from the nodes that compute them, into context `context_id`; the engine's
// own result for such a leaf is then undefined, so that the caller does not add it again.
void deliver_gradients_as_computed(std::int64_t context_id, const std::vector<at::Tensor>& roots);

// The gradients of remote tensors (RRefs to leaves, e.g. RemoteModule::remote_parameters()),
// fetched from their owners, in order; an undefined tensor where none accumulated.
std::vector<at::Tensor> get_gradients(std::int64_t context_id,
                                      const std::vector<rpc::RRefPtr>& tensors);

// Seconds worker `worker` has spent computing its parts of backward, all contexts so far.
double backward_seconds(const std::string& worker);

// Contexts alive in this process, and on worker `worker` (asked by RPC).
std::size_t context_count();
std::int64_t context_count(const std::string& worker);

}  // namespace ferry::dist_autograd
