// A stage's backward of one micro-batch during pipelined steps (stage_runtime.cc has the forward
// and the requests): from the gradients of its outputs, or from its own share of the loss on a
// last stage that computes it, back to the gradients of its inputs, which go on to the stage
// before, and its parameters' gradients, which go into the step's autograd context. Under the
// zero-bubble schedule the backward is split, and its weight pass deferred (deferred_weights.cc).
//
// Thread rules: run_backward runs on the compute thread.
#include <fmt/format.h>
#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <optional>

#include "ferry/dist_autograd/context.h"
#include "ferry/remote_module/portal.h"
#include "ferry/remote_module/portal_flow.h"
#include "ferry/remote_module/stage_here.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "pipeline/stage_slot.h"

namespace ferry::pipeline {
namespace {

using rpc::Error;
using rpc::ErrorKind;
using rpc::FuturePtr;

// Sets the CPU generator's state for a recomputation and puts the current one back after it.
class RngStateGuard {
 public:
  explicit RngStateGuard(const at::Tensor& state) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    previous_ = gen.get_state();
    gen.set_state(state);
  }
  ~RngStateGuard() {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(previous_);
  }

 private:
  at::Tensor previous_;
};

// What the micro-batch's forward kept here, taken out of the slot for its backward.
Saved take_saved(Slot& slot, std::int64_t context, std::int64_t microbatch) {
  std::lock_guard<std::mutex> lock(slot.mutex);
  auto it = slot.saved.find({context, microbatch});
  if (it == slot.saved.end()) {
    throw Error(ErrorKind::InvalidArgument,
                "no forward of it is kept here (discarded, or backward ran already)");
  }
  Saved saved = std::move(it->second);
  slot.saved.erase(it);
  slot.activation_bytes -= saved.bytes;
  return saved;
}

// The gradients of the stage's inputs on to the stage before; `done` completes when its backward
// has (the first stage's at once). The backward's events are recorded before `done` can
// complete: the master reads them once it has.
void send_input_grads(Slot& slot, std::int64_t microbatch, std::int64_t start,
                      const c10::List<at::Tensor>& input_grads, const FuturePtr& done) {
  std::int64_t computed = now_ns();
  record(slot, kBackwardEvent, microbatch, start, computed);
  if (slot.index == 0) {
    done->markCompleted(c10::IValue());
    return;
  }
  FuturePtr call = rpc::rpc_async(slot.previous, "ferry.pipeline.backward",
                                  {slot.pipeline, slot.index - 1, microbatch, input_grads});
  record(slot, kSendBackwardEvent, microbatch, computed, now_ns());
  complete_with(call, done);
}

// A recomputed forward must not move the stage's buffers a second time: batch norms' running
// statistics took the micro-batch once, in its first forward. They are put back once the
// backward that needed the recomputed graph has run (putting them back bumps their version, which
// that graph would refuse). On the compute thread, where no other forward of the stage runs
// meanwhile.
class BuffersKept {
 public:
  explicit BuffersKept(const rpc::RRefPtr& module) {
    for (at::Tensor& b : remote_module::stage_buffers_here(module)) {
      if (b.defined()) kept_.emplace_back(b, b.clone());
    }
  }
  ~BuffersKept() {
    at::NoGradGuard no_grad;
    for (auto& [buffer, before] : kept_) buffer.copy_(before);
  }
  BuffersKept(const BuffersKept&) = delete;
  BuffersKept& operator=(const BuffersKept&) = delete;

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> kept_;
};

// The roots of a micro-batch's backward and their gradients: its share of the loss on a last
// stage that computes it, else the outputs whose gradients arrived.
void backward_roots(const Slot& slot, const Saved& saved, const c10::IValue& output,
                    const std::vector<at::Tensor>& grads, std::vector<at::Tensor>* roots,
                    std::vector<at::Tensor>* root_grads) {
  if (computes_loss(slot)) {
    at::Tensor root = slot.checkpoint ? loss_share(slot, output, saved) * saved.scale : saved.loss;
    roots->push_back(root);
    root_grads->push_back(at::ones_like(root));
    return;
  }
  std::vector<at::Tensor> outputs = floating_tensors(output);
  if (outputs.size() != grads.size()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("{} gradients arrived for {} floating-point outputs", grads.size(),
                            outputs.size()));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (outputs[i].requires_grad() && grads[i].defined()) {
      roots->push_back(outputs[i]);
      root_grads->push_back(grads[i]);
    }
  }
}

std::vector<at::Tensor> trainable_parameters(const Slot& slot) {
  std::vector<at::Tensor> params;
  for (at::Tensor& p : remote_module::stage_parameters_here(slot.module)) {
    if (p.requires_grad()) params.push_back(p);
  }
  return params;
}

// The backward in one pass: the parameters' gradients go into the context; returns the gradients
// of `inputs`.
std::vector<at::Tensor> whole_backward(std::int64_t context, const std::vector<at::Tensor>& roots,
                                       const std::vector<at::Tensor>& root_grads,
                                       const std::vector<at::Tensor>& inputs,
                                       const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> targets = inputs;
  targets.insert(targets.end(), params.begin(), params.end());
  std::vector<at::Tensor> found(targets.size());
  if (!roots.empty() && !targets.empty()) {
    dist_autograd::deliver_gradients_as_computed(context, roots);
    found = torch::autograd::grad(roots, targets, root_grads, /*retain_graph=*/false,
                                  /*create_graph=*/false, /*allow_unused=*/true);
  }
  // Fresh from a backward whose graph is gone: the context may keep and add into them.
  dist_autograd::accumulate_gradients(
      context, params, std::vector<at::Tensor>(found.begin() + inputs.size(), found.end()),
      /*handed_over=*/true);
  found.resize(inputs.size());
  return found;
}

// Under the zero-bubble schedule, the split of this backward, if its graph splits.
std::shared_ptr<SplitBackward> split_of(const Slot& slot, const std::vector<at::Tensor>& roots,
                                        const std::vector<at::Tensor>& root_grads,
                                        const std::vector<at::Tensor>& inputs,
                                        const std::vector<at::Tensor>& params) {
  // A recomputed stage puts its buffers back once its backward is done; a deferred pass would
  // find them changed.
  if (!slot.split_backward || slot.checkpoint || roots.empty()) return nullptr;
  auto split = std::make_shared<SplitBackward>(roots, root_grads, inputs, params);
  return split->splits() ? split : nullptr;
}

}  // namespace

// On the compute thread.
void run_backward(const SlotPtr& slot, std::int64_t context, std::int64_t microbatch,
                  std::vector<at::Tensor> grads, const FuturePtr& done) {
  std::int64_t start = now_ns();
  bool had_forward = false;
  try {
    Saved saved = take_saved(*slot, context, microbatch);
    had_forward = true;
    // Puts the buffers back when this micro-batch is done with: after its backward, or failed.
    std::optional<BuffersKept> buffers;
    c10::IValue output = saved.output;
    if (slot->checkpoint) {
      buffers.emplace(slot->module);
      RngStateGuard same_randomness(saved.rng_state);
      remote_module::ForwardPassScope pass({context, /*recompute=*/true});
      output = remote_module::forward_stage_here(slot->module, saved.inputs);
      if (routes_output(*slot)) {
        output = remote_module::join_portals(slot->routes, slot->workers, slot->index,
                                             {context, microbatch}, output);
      }
    }
    std::vector<at::Tensor> roots, root_grads;
    backward_roots(*slot, saved, output, grads, &roots, &root_grads);
    // The anchors' own gradients are none, but asking for them is what makes the portal inputs'
    // nodes run and offer theirs.
    std::vector<at::Tensor> inputs = saved.leaves;
    inputs.insert(inputs.end(), saved.anchors.begin(), saved.anchors.end());
    const std::vector<at::Tensor> params = trainable_parameters(*slot);
    std::shared_ptr<SplitBackward> split = split_of(*slot, roots, root_grads, inputs, params);
    std::vector<at::Tensor> found =
        split ? split->input_pass(into_context(context))
              : whole_backward(context, roots, root_grads, inputs, params);
    c10::List<at::Tensor> input_grads;
    for (size_t i = 0; i < saved.leaves.size(); ++i) input_grads.push_back(found[i]);
    // The graph goes now (what the weight pass needs excepted), before the gradients travel on.
    const std::int64_t bytes = saved.bytes;
    saved = Saved();
    output = c10::IValue();
    roots.clear();
    root_grads.clear();
    inputs.clear();
    if (split) defer_weights(slot, {context, microbatch, std::move(split), bytes});
    send_input_grads(*slot, microbatch, start, input_grads, done);
  } catch (...) {
    done->setError(failure_in(*slot, "backward", microbatch));
  }
  if (had_forward) release_place(*slot);
}

}  // namespace ferry::pipeline
