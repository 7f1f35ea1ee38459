// Distributed backward, FAST mode. Each process runs its own part of the graph with the local
// engine, from the roots (on the master) or from a send function whose gradients just arrived.
// The engine is asked only for the gradients at the edges where this process's part ends: leaves,
// whose gradients the context keeps, and RecvBackward inputs, whose gradients go back by RPC to
// the sender, which runs its part the same way. A part's future completes when every part it
// started has completed, so the master's backward() returns when the whole graph is done.
//
// A part reached through several send functions (a tensor sent to two workers), or whose send
// function may receive gradients more than once (its tensors were used by several parts of the
// receiver), runs once per incoming gradient; backward is linear in its incoming gradient, so the
// sum is exact, and those parts keep their buffers until the context is released. Every other
// part frees its buffers as it runs (unless the master's backward retains the graph), so a stage
// holds a step's activations only until its own backward has run, not until the context is
// released after the optimizer's step. A gradient message says whether it is the last its send
// function will get: it is when no other part of the sender's reaches the same RecvBackward, and
// the part that sends it was itself started by its send function's last message (a part that
// runs again sends again).
#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <unordered_set>

#include "dist_autograd/context_store.h"
#include "dist_autograd/gradient_sink.h"
#include "dist_autograd/install.h"
#include "dist_autograd/owned_value.h"
#include "dist_autograd/recv_backward.h"
#include "ferry/core/compute_thread.h"
#include "ferry/core/message_of.h"
#include "ferry/dist_autograd/context.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/fan_out.h"
#include "ferry/rpc/rpc.h"

namespace ferry::dist_autograd {
namespace {

using rpc::FuturePtr;
using torch::autograd::AccumulateGrad;
using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

// Time this process spent running its parts of backward, all contexts (nanoseconds).
std::atomic<std::int64_t> part_nanoseconds{0};

bool ends_part(const Node* node) {
  return dynamic_cast<const AccumulateGrad*>(node) || dynamic_cast<const RecvBackward*>(node);
}

// The edges where this process's part of the graph reachable from `roots` ends.
edge_list part_ends(const edge_list& roots) {
  edge_list ends;
  std::unordered_set<const Node*> seen;
  std::vector<std::shared_ptr<Node>> stack;
  auto visit = [&](const Edge& edge) {
    if (edge.function && seen.insert(edge.function.get()).second) stack.push_back(edge.function);
  };
  for (const Edge& root : roots) visit(root);
  while (!stack.empty()) {
    std::shared_ptr<Node> node = std::move(stack.back());
    stack.pop_back();
    if (dynamic_cast<AccumulateGrad*>(node.get())) {
      ends.emplace_back(node, 0);
    } else if (dynamic_cast<RecvBackward*>(node.get())) {
      for (std::uint32_t i = 0; i < node->num_inputs(); ++i) ends.emplace_back(node, i);
    } else {
      for (const Edge& next : node->next_edges()) visit(next);
    }
  }
  return ends;
}

// The nodes of this process's part reachable from `roots`, ends excluded.
std::unordered_set<const Node*> part_nodes(const edge_list& roots) {
  std::unordered_set<const Node*> seen;
  std::vector<Node*> stack;
  auto visit = [&](const Edge& edge) {
    const Node* node = edge.function.get();
    if (node && !ends_part(node) && seen.insert(node).second) stack.push_back(edge.function.get());
  };
  for (const Edge& root : roots) visit(root);
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& next : node->next_edges()) visit(next);
  }
  return seen;
}

// The RecvBackward nodes that a part started from `starts` sends gradients to.
std::unordered_set<const Node*> recvs_reached(const edge_list& starts) {
  std::unordered_set<const Node*> out;
  for (const Edge& end : part_ends(starts)) {
    if (dynamic_cast<const RecvBackward*>(end.function.get())) out.insert(end.function.get());
  }
  return out;
}

// The part started by a backward() call on this process, not by a gradient message.
constexpr std::int64_t kRootPart = -1;

// The RecvBackward nodes that parts of `context` other than `start` (a message id or kRootPart)
// reach: gradients may go to their senders from there too.
std::unordered_set<const Node*> reached_by_other_parts(const ContextState& context,
                                                       std::int64_t start) {
  std::unordered_set<const Node*> out;
  auto add = [&](const edge_list& starts) {
    for (const Node* node : recvs_reached(starts)) out.insert(node);
  };
  for (const auto& [id, send] : context.sends()) {
    if (id != start) add(send.edges);
  }
  if (start != kRootPart) add(context.roots());
  return out;
}

// Whether gradients arriving for another send function of `context` may run through a node of
// send `message_id`'s part: then that part must keep its buffers.
bool part_is_shared(const ContextState& context, std::int64_t message_id, const edge_list& edges) {
  const std::unordered_set<const Node*> mine = part_nodes(edges);
  for (const auto& [id, other] : context.sends()) {
    if (id == message_id) continue;
    for (const Node* node : part_nodes(other.edges)) {
      if (mine.count(node)) return true;
    }
  }
  return false;
}

// Hands the gradients a node computes for sunk leaves (gradient_sink.h) to the context as soon as
// the node has run, not when the whole part is done: a replica's bucket can start its all-reduce
// while the rest of the backward computes. A leaf fed by several nodes gets one contribution from
// each, which sum to what the engine would have captured at the part's end; the hook leaves the
// engine nothing to capture.
class DeliverToSinks : public torch::autograd::FunctionPostHook {
 public:
  DeliverToSinks(std::int64_t context_id, std::vector<std::pair<std::size_t, at::Tensor>> leaves)
      : context_id_(context_id), leaves_(std::move(leaves)) {}

  variable_list operator()(const variable_list& outputs, const variable_list& inputs) override {
    (void)inputs;
    // The graph may outlive its context; a released context takes nothing.
    ContextPtr context = find_context(context_id_);
    if (!context) return outputs;
    variable_list kept = outputs;
    for (const auto& [index, variable] : leaves_) {
      if (index < kept.size() && kept[index].defined()) {
        context->accumulate(variable, kept[index]);
        // Delivered: the engine must not hold it too until the part ends (a second copy of
        // every gradient at the peak).
        kept[index] = at::Tensor();
      }
    }
    return kept;
  }

 private:
  std::int64_t context_id_;
  std::vector<std::pair<std::size_t, at::Tensor>> leaves_;  // output index, leaf
};

bool delivers_to_sinks(const Node& node) {
  return std::any_of(node.post_hooks().begin(), node.post_hooks().end(), [](const auto& hook) {
    return dynamic_cast<const DeliverToSinks*>(hook.get()) != nullptr;
  });
}

// Sets up early delivery for the sunk leaves among `ends` of the part from `roots`; returns those
// leaves' nodes, whose captured gradients the part must then leave out.
std::unordered_set<const Node*> deliver_sunk_leaves_early(std::int64_t context_id,
                                                          const edge_list& roots,
                                                          const edge_list& ends) {
  std::unordered_set<const Node*> sunk;
  if (!has_gradient_sinks()) return sunk;
  for (const Edge& end : ends) {
    auto* leaf = dynamic_cast<AccumulateGrad*>(end.function.get());
    if (leaf && gradient_sink(leaf->variable)) sunk.insert(leaf);
  }
  if (sunk.empty()) return sunk;
  std::unordered_set<const Node*> seen;
  std::vector<std::shared_ptr<Node>> stack;
  auto visit = [&](const Edge& edge) {
    const Node* node = edge.function.get();
    if (node && !ends_part(node) && seen.insert(node).second) stack.push_back(edge.function);
  };
  for (const Edge& root : roots) visit(root);
  while (!stack.empty()) {
    std::shared_ptr<Node> node = std::move(stack.back());
    stack.pop_back();
    std::vector<std::pair<std::size_t, at::Tensor>> leaves;
    const edge_list& next = node->next_edges();
    for (std::size_t i = 0; i < next.size(); ++i) {
      if (sunk.count(next[i].function.get())) {
        leaves.emplace_back(i, static_cast<AccumulateGrad*>(next[i].function.get())->variable);
      }
      visit(next[i]);
    }
    // A part that runs again on the same nodes finds them already delivering.
    if (!leaves.empty() && !delivers_to_sinks(*node)) {
      node->add_post_hook(std::make_unique<DeliverToSinks>(context_id, std::move(leaves)));
    }
  }
  return sunk;
}

// Gradients arriving at the ends of a part: leaves go into the context, RecvBackward inputs are
// gathered per node to be sent back, with whether the graph is to be retained.
class PartResult {
 public:
  PartResult(ContextState& context, bool retain_graph)
      : context_(context), retain_graph_(retain_graph) {}

  void add(const Edge& edge, const at::Tensor& grad) {
    if (!grad.defined()) return;
    if (auto* leaf = dynamic_cast<AccumulateGrad*>(edge.function.get())) {
      context_.accumulate(leaf->variable, grad);
      return;
    }
    auto recv = std::static_pointer_cast<RecvBackward>(edge.function);
    auto& grads = to_send_[recv];
    grads.resize(recv->num_inputs());
    at::Tensor& slot = grads[edge.input_nr];
    slot = slot.defined() ? slot + grad : grad;
  }

  // Sends each gathered gradient to its sender, saying whether another part here may send it more
  // (a node in `reached_elsewhere`, or this part itself, when it may run again: it was started by
  // a message that was not its send function's last); the futures of those calls.
  std::vector<FuturePtr> send(const std::unordered_set<const Node*>& reached_elsewhere,
                              bool runs_once) {
    std::vector<FuturePtr> calls;
    const auto& workers = rpc::workers();
    for (auto& [recv, grads] : to_send_) {
      c10::List<at::Tensor> list;
      for (auto& g : grads) list.push_back(g);
      calls.push_back(
          rpc::rpc_async(workers.at(recv->from_rank()).name, "ferry.autograd.backward",
                         {context_.id(), recv->message_id(), std::move(list), retain_graph_,
                          runs_once && !reached_elsewhere.count(recv.get())}));
    }
    return calls;
  }

 private:
  ContextState& context_;
  bool retain_graph_;
  std::map<std::shared_ptr<RecvBackward>, std::vector<at::Tensor>> to_send_;
};

// The error of a part that failed here.
rpc::Error part_failed(std::int64_t context_id, const std::string& what,
                       rpc::ErrorKind kind = rpc::ErrorKind::RemoteException) {
  return rpc::Error(kind,
                    fmt::format("distributed backward of context {} failed on worker \"{}\": {}",
                                context_id, self_name(), what));
}

// The error of a part whose computation threw `failure`: running out of memory stays
// OutOfMemory, so that the master can tell it from other failures.
rpc::Error part_failed(std::int64_t context_id, std::exception_ptr failure) {
  const rpc::Failure told = rpc::failure_of(failure);
  return part_failed(
      context_id, told.message,
      told.kind == rpc::ErrorKind::OutOfMemory ? told.kind : rpc::ErrorKind::RemoteException);
}

// Passes the failure among `calls` that rpc::first_failure picks on unchanged when another worker
// raised it (its message already names that worker), or says what happened to the call (a worker
// died, a deadline).
void rethrow_first_failure(std::int64_t context_id, const std::vector<FuturePtr>& calls) {
  // Every backward passes here; most fail nowhere, and then nothing is collected.
  if (std::none_of(calls.begin(), calls.end(), [](const FuturePtr& c) { return c->hasError(); })) {
    return;
  }
  std::vector<std::exception_ptr> failures;
  for (const auto& call : calls) {
    failures.push_back(call->hasError() ? call->exception_ptr() : nullptr);
  }
  const std::exception_ptr failure = rpc::first_failure(failures);
  if (!failure) return;
  try {
    std::rethrow_exception(failure);
  } catch (const rpc::Error& e) {
    if (!e.cause().empty()) throw e.restated(e.cause());
    throw e.restated(
        fmt::format("distributed backward of context {} failed: {}", context_id, e.what()));
  } catch (const std::exception&) {
    throw part_failed(context_id, failure);
  }
}

// Runs this process's part (`part`: the message id of the send function it starts from, or
// kRootPart) from `roots` with `grads`; the future completes when every part it
// started elsewhere has completed. Throws if the local part fails. `retain_graph` is the master's
// wish, passed on to the parts this one starts; `keep_graph` is whether this part keeps its own;
// `runs_once` is whether no further message can start it again.
FuturePtr run_part(ContextState& context, std::int64_t part, const edge_list& roots,
                   const variable_list& grads, bool keep_graph, bool retain_graph, bool runs_once) {
  PartResult result(context, retain_graph);
  edge_list engine_roots;
  variable_list engine_grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!roots[i].function || !grads[i].defined()) continue;
    // A root that is itself an end needs no engine (and the engine could not capture a
    // gradient at the node it starts from).
    if (ends_part(roots[i].function.get())) {
      result.add(roots[i], grads[i]);
    } else {
      engine_roots.push_back(roots[i]);
      engine_grads.push_back(grads[i]);
    }
  }
  edge_list ends = part_ends(engine_roots);
  const std::unordered_set<const Node*> delivered =
      deliver_sunk_leaves_early(context.id(), engine_roots, ends);
  auto start = std::chrono::steady_clock::now();
  if (!ends.empty()) {
    try {
      variable_list captured = torch::autograd::Engine::get_default_engine().execute(
          engine_roots, engine_grads, keep_graph, /*create_graph=*/false,
          /*accumulate_grad=*/false, ends);
      for (size_t i = 0; i < ends.size(); ++i) {
        if (!delivered.count(ends[i].function.get())) result.add(ends[i], captured[i]);
      }
    } catch (const std::exception&) {
      throw part_failed(context.id(), std::current_exception());
    }
  }
  part_nanoseconds +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  std::vector<FuturePtr> calls = result.send(reached_by_other_parts(context, part), runs_once);
  std::int64_t id = context.id();
  return rpc::when_all(calls)->then(
      [id, calls](c10::ivalue::Future&) {
        rethrow_first_failure(id, calls);
        return c10::IValue();
      },
      c10::NoneType::get());
}

}  // namespace

void backward(std::int64_t context_id, const std::vector<at::Tensor>& roots, bool retain_graph,
              const std::vector<at::Tensor>& root_grads) {
  ContextPtr context = context_or_throw(context_id, "backward");
  if (!root_grads.empty() && root_grads.size() != roots.size()) {
    throw rpc::Error(
        rpc::ErrorKind::InvalidArgument,
        fmt::format("backward: {} roots but {} root gradients", roots.size(), root_grads.size()));
  }
  edge_list edges;
  variable_list grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const at::Tensor& root = roots[i];
    if (!root.defined() || !root.requires_grad()) {
      throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                       fmt::format("backward: root {} does not require grad", i));
    }
    if (root_grads.empty() && root.numel() != 1) {
      throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                       fmt::format("backward: root {} has {} elements; give its gradient or "
                                   "reduce it to a scalar",
                                   i, root.numel()));
    }
    edges.push_back(torch::autograd::impl::gradient_edge(root));
    grads.push_back(root_grads.empty() ? at::ones_like(root) : root_grads[i]);
  }
  context->add_roots(edges);
  run_part(*context, kRootPart, edges, grads, retain_graph, retain_graph, /*runs_once=*/true)
      ->waitAndThrow();
}

c10::Dict<at::Tensor, at::Tensor> get_gradients(std::int64_t context_id) {
  ContextPtr context = context_or_throw(context_id, "get_gradients");
  c10::Dict<at::Tensor, at::Tensor> out;
  for (auto& [variable, grad] : context->gradients()) out.insert(variable, grad);
  return out;
}

void accumulate_gradients(std::int64_t context_id, const std::vector<at::Tensor>& variables,
                          const std::vector<at::Tensor>& grads, bool handed_over) {
  if (variables.size() != grads.size()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("accumulate_gradients: {} variables but {} gradients",
                                 variables.size(), grads.size()));
  }
  ContextPtr context = join_context(context_id);
  if (!context) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("accumulate_gradients: autograd context {} was released on "
                                 "worker \"{}\"",
                                 context_id, self_name()));
  }
  for (size_t i = 0; i < variables.size(); ++i) {
    if (grads[i].defined()) context->accumulate(variables[i], grads[i], handed_over);
  }
}

void deliver_gradients_as_computed(std::int64_t context_id, const std::vector<at::Tensor>& roots) {
  if (!has_gradient_sinks()) return;
  edge_list edges;
  for (const at::Tensor& root : roots) {
    if (root.defined() && root.requires_grad()) {
      edges.push_back(torch::autograd::impl::gradient_edge(root));
    }
  }
  deliver_sunk_leaves_early(context_id, edges, part_ends(edges));
}

std::vector<at::Tensor> get_gradients(std::int64_t context_id,
                                      const std::vector<rpc::RRefPtr>& tensors) {
  // One call per owner, each with its tensors in order.
  std::map<std::string, std::vector<size_t>> by_owner;
  for (size_t i = 0; i < tensors.size(); ++i) by_owner[tensors[i]->ownerName()].push_back(i);
  std::vector<at::Tensor> out(tensors.size());
  for (auto& [owner, indices] : by_owner) {
    c10::impl::GenericList refs(c10::AnyType::get());
    for (size_t i : indices) refs.push_back(rpc::to_ivalue(tensors[i]));
    c10::IValue grads = rpc::rpc_sync(owner, "ferry.autograd.gradients", {context_id, refs});
    auto list = grads.toTensorVector();
    for (size_t k = 0; k < indices.size(); ++k) out[indices[k]] = list.at(k);
  }
  return out;
}

double backward_seconds(const std::string& worker) {
  return rpc::rpc_sync(worker, "ferry.autograd.backward_seconds", {}).toDouble();
}

void install_backward_functions(rpc::FunctionRegistry& registry) {
  registry.add("ferry.autograd.backward_seconds", []() { return part_nanoseconds.load() * 1e-9; });
  registry.add_async("ferry.autograd.backward", [](std::vector<c10::IValue>& args) {
    std::int64_t id = args.at(0).toInt();
    std::int64_t message_id = args.at(1).toInt();
    std::vector<at::Tensor> grads = args.at(2).toTensorVector();
    // Senders that do not say keep the graph, as every part did before the flags existed.
    const bool retain_graph = args.size() < 5 || args.at(3).toBool();
    const bool last = args.size() >= 5 && args.at(4).toBool();
    ContextPtr context = find_context(id);
    if (!context) throw part_failed(id, "the context is unknown here (already released?)");
    SendFunction send = context->send(message_id);
    if (grads.size() != send.edges.size()) {
      throw part_failed(id, fmt::format("{} gradients arrived for a message that sent {} tensors "
                                        "requiring grad",
                                        grads.size(), send.edges.size()));
    }
    return core::on_compute_thread([&] {
      bool keep = retain_graph || !last || part_is_shared(*context, message_id, send.edges);
      return run_part(*context, message_id, send.edges, grads, keep, retain_graph, last);
    });
  });
  registry.add("ferry.autograd.gradients", [](std::int64_t id, c10::IValue refs) {
    ContextPtr context = find_context(id);
    c10::List<at::Tensor> out;
    for (const c10::IValue& ref : refs.toListRef()) {
      at::Tensor variable = owned_value(ref, "gradients").toTensor();
      out.push_back(context ? context->gradient(variable) : at::Tensor());
    }
    return out;
  });
}

}  // namespace ferry::dist_autograd
