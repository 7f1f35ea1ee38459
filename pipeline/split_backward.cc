#include "pipeline/split_backward.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace ferry::pipeline {
namespace {

using torch::autograd::AccumulateGrad;
using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

// The gradients that reached a node in the input pass.
struct Incoming {
  bool taken = false;
  variable_list grads;
};

// Keeps what reaches its node the first time it runs (the input pass); the weight pass runs the
// node again from exactly that.
class KeepIncoming : public torch::autograd::FunctionPreHook {
 public:
  explicit KeepIncoming(std::shared_ptr<Incoming> incoming) : incoming_(std::move(incoming)) {}
  variable_list operator()(const variable_list& grads) override {
    if (!incoming_->taken) {
      incoming_->grads = grads;
      incoming_->taken = true;
    }
    return grads;
  }

 private:
  std::shared_ptr<Incoming> incoming_;
};

// The input pass keeps the graph for the weight pass, but a node that has no part in it frees its
// saved tensors as soon as it has run, as a backward that does not keep the graph would.
class ReleaseAfterRun : public torch::autograd::FunctionPostHook {
 public:
  explicit ReleaseAfterRun(Node* node) : node_(node) {}
  variable_list operator()(const variable_list& outputs, const variable_list&) override {
    node_->release_variables();
    return outputs;
  }

 private:
  Node* node_;  // the node that owns this hook
};

edge_list edges_of(const std::vector<at::Tensor>& tensors) {
  edge_list out;
  for (const at::Tensor& t : tensors) out.push_back(torch::autograd::impl::gradient_edge(t));
  return out;
}

}  // namespace

struct SplitBackward::Work {
  std::shared_ptr<Node> node;          // null: the roots that reach no input
  std::shared_ptr<Incoming> incoming;  // what reached `node` in the input pass
  edge_list roots;                     // without `node`: those roots, and their gradients
  variable_list root_grads;
  edge_list outputs;  // the gradient edges of `params`
  std::vector<at::Tensor> params;
};

struct SplitBackward::Graph {
  edge_list roots, inputs;
  // The vector parameters whose nodes the input pass runs, with their gradient edges.
  edge_list vector_outputs;
  std::vector<at::Tensor> vector_params;
  // Every node reached from the roots, and whether it reaches an input; those that do, the nodes
  // the input pass runs, in the order they were reached.
  std::unordered_map<const Node*, bool> reaches_input;
  std::vector<std::shared_ptr<Node>> input_nodes;

  bool reaches(const Node* node) const {
    auto it = reaches_input.find(node);
    return it != reaches_input.end() && it->second;
  }

  // Marks every node reachable from `start` with whether it reaches one of `targets`.
  void mark(Node* start, const std::unordered_set<const Node*>& targets) {
    if (!start || reaches_input.count(start)) return;
    std::vector<std::pair<Node*, std::size_t>> stack{{start, 0}};
    reaches_input[start] = false;
    while (!stack.empty()) {
      Node* node = stack.back().first;
      std::size_t& child = stack.back().second;
      const edge_list& next = node->next_edges();
      if (!targets.count(node) && child < next.size()) {
        Node* down = next[child++].function.get();
        if (down && reaches_input.emplace(down, false).second) stack.emplace_back(down, 0);
        continue;
      }
      stack.pop_back();
      bool reached = targets.count(node) > 0;
      for (const Edge& e : next) reached = reached || reaches(e.function.get());
      reaches_input[node] = reached;
      if (reached && !targets.count(node)) input_nodes.push_back(node->shared_from_this());
    }
  }
};

SplitBackward::SplitBackward(const std::vector<at::Tensor>& roots,
                             const std::vector<at::Tensor>& root_grads,
                             const std::vector<at::Tensor>& inputs,
                             const std::vector<at::Tensor>& params)
    : graph_(std::make_unique<Graph>()) {
  plan(roots, root_grads, inputs, params);
  if (!splits_) return;
  root_grads_ = root_grads;
  std::unordered_set<const Node*> deferred;
  for (auto& work : work_) {
    if (!work->node) continue;
    work->node->add_pre_hook(std::make_unique<KeepIncoming>(work->incoming));
    deferred.insert(work->node.get());
  }
  for (const std::shared_ptr<Node>& node : graph_->input_nodes) {
    if (!deferred.count(node.get())) {
      node->add_post_hook(std::make_unique<ReleaseAfterRun>(node.get()));
    }
  }
}

SplitBackward::~SplitBackward() = default;

void SplitBackward::plan(const std::vector<at::Tensor>& roots,
                         const std::vector<at::Tensor>& root_grads,
                         const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& params) {
  Graph& graph = *graph_;
  graph.roots = edges_of(roots);
  graph.inputs = edges_of(inputs);
  std::unordered_set<const Node*> targets;
  for (const Edge& e : graph.inputs) targets.insert(e.function.get());
  for (const Edge& e : graph.roots) graph.mark(e.function.get(), targets);

  std::unordered_map<const Node*, std::size_t> param_of;
  for (std::size_t k = 0; k < params.size(); ++k) {
    param_of[torch::autograd::impl::gradient_edge(params[k]).function.get()] = k;
  }
  std::vector<const Work*> owner(params.size(), nullptr);
  std::vector<std::unique_ptr<Work>> owned;
  // The parameters under `start`, whose nodes the input pass does not run, go to `work`.
  auto collect = [&](Node* start, Work& work) {
    std::vector<Node*> stack{start};
    std::unordered_set<const Node*> seen{start};
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      auto param = param_of.find(node);
      if (param != param_of.end()) {
        const std::size_t k = param->second;
        if (owner[k] != nullptr && owner[k] != &work) splits_ = false;
        if (owner[k] == nullptr) {
          owner[k] = &work;
          work.outputs.emplace_back(node->shared_from_this(), 0);
          work.params.push_back(params[k]);
        }
        continue;
      }
      for (const Edge& e : node->next_edges()) {
        if (e.function && seen.insert(e.function.get()).second) stack.push_back(e.function.get());
      }
    }
  };
  auto roots_work = std::make_unique<Work>();
  for (std::size_t i = 0; i < graph.roots.size(); ++i) {
    const Edge& root = graph.roots[i];
    if (!root.function || graph.reaches(root.function.get())) continue;
    roots_work->roots.push_back(root);
    roots_work->root_grads.push_back(root_grads[i]);
    collect(root.function.get(), *roots_work);
  }
  for (const std::shared_ptr<Node>& node : graph.input_nodes) {
    auto work = std::make_unique<Work>();
    for (const Edge& e : node->next_edges()) {
      if (e.function && !graph.reaches(e.function.get())) collect(e.function.get(), *work);
    }
    if (work->outputs.empty()) continue;
    const bool vectors = std::all_of(work->params.begin(), work->params.end(),
                                     [](const at::Tensor& p) { return p.dim() <= 1; });
    if (vectors) {
      graph.vector_outputs.insert(graph.vector_outputs.end(), work->outputs.begin(),
                                  work->outputs.end());
      graph.vector_params.insert(graph.vector_params.end(), work->params.begin(),
                                 work->params.end());
      owned.push_back(std::move(work));  // its parameters stay owned, for the check above
      continue;
    }
    work->node = node;
    work->incoming = std::make_shared<Incoming>();
    work_.push_back(std::move(work));
  }
  // The roots' own part last: on a first stage it is the whole backward.
  if (!roots_work->outputs.empty()) work_.push_back(std::move(roots_work));
  if (!splits_) work_.clear();
}

std::vector<at::Tensor> SplitBackward::input_pass(const Deliver& deliver) {
  if (!graph_) throw std::logic_error("SplitBackward::input_pass runs once");
  Graph& graph = *graph_;
  std::vector<at::Tensor> grads(graph.inputs.size());
  if (!graph.inputs.empty() && !graph.input_nodes.empty()) {
    edge_list roots;
    variable_list root_grads;
    for (std::size_t i = 0; i < graph.roots.size(); ++i) {
      if (graph.reaches(graph.roots[i].function.get())) {
        roots.push_back(graph.roots[i]);
        root_grads.push_back(root_grads_[i]);
      }
    }
    edge_list outputs = graph.inputs;
    outputs.insert(outputs.end(), graph.vector_outputs.begin(), graph.vector_outputs.end());
    variable_list found = torch::autograd::Engine::get_default_engine().execute(
        roots, root_grads, /*keep_graph=*/true, /*create_graph=*/false,
        /*accumulate_grad=*/false, outputs);
    std::move(found.begin(), found.begin() + graph.inputs.size(), grads.begin());
    if (!graph.vector_params.empty()) {
      deliver(graph.vector_params,
              std::vector<at::Tensor>(found.begin() + graph.inputs.size(), found.end()));
    }
  }
  // The input gradients are out: what led to them goes, so that the weight pass runs each node
  // for its parameters only, and nodes without a weight pass free their buffers now.
  for (const std::shared_ptr<Node>& node : graph.input_nodes) {
    for (Edge& e : node->next_edges()) {
      if (e.function && graph.reaches(e.function.get())) e = Edge();
    }
  }
  graph_.reset();
  root_grads_.clear();
  return grads;
}

bool SplitBackward::weight_step(const Deliver& deliver) {
  if (!weights_left()) return false;
  std::unique_ptr<Work> work = std::move(work_[next_++]);
  edge_list roots = std::move(work->roots);
  variable_list grads = std::move(work->root_grads);
  if (work->node) {
    const variable_list& incoming = work->incoming->grads;
    for (std::size_t i = 0; i < incoming.size(); ++i) {
      if (incoming[i].defined()) {
        roots.emplace_back(work->node, static_cast<std::uint32_t>(i));
        grads.push_back(incoming[i]);
      }
    }
    work->incoming->grads.clear();
  }
  if (!roots.empty()) {
    variable_list found = torch::autograd::Engine::get_default_engine().execute(
        roots, grads, /*keep_graph=*/false, /*create_graph=*/false, /*accumulate_grad=*/false,
        work->outputs);
    deliver(work->params, found);
  }
  return weights_left();
}

}  // namespace ferry::pipeline
