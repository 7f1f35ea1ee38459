// A stage's worker during pipelined steps. Each micro-batch's forward runs under grad mode and its
// graph is kept here, keyed by the step's autograd context and the micro-batch, until that
// micro-batch's backward frees it; nothing of the graph crosses the wire (tensors are sent
// detached), so distributed autograd records nothing and each backward is a local one.
//
// Requests do not hold pool threads while they wait their turn: forward and backward are posted
// to the compute thread, which runs them in arrival order, and the handler answers with a future
// that completes when the rest of the chain has. Under 1F1B a stage takes at most its in-flight
// limit of forwards; further ones are parked until a backward frees a place, which is what makes
// each stage alternate forward and backward.
#include <fmt/format.h>
#include <torch/torch.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "ferry/core/compute_thread.h"
#include "ferry/core/process_memory.h"
#include "ferry/dist_autograd/context.h"
#include "ferry/pipeline/pipeline.h"
#include "ferry/remote_module/portal.h"
#include "ferry/remote_module/stage_host.h"
#include "ferry/remote_module/step_statistics.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "pipeline/stage_slot.h"
#include "remote_module/portal_flow.h"
#include "remote_module/stage_here.h"

namespace ferry::pipeline {
namespace {

using rpc::Error;
using rpc::ErrorKind;
using rpc::FuturePtr;

// The floating-point tensors of a stage's inputs or outputs, in the order the wire carries them;
// gradients travel in this order.
void collect_floating(const c10::IValue& value, std::vector<at::Tensor>* out) {
  if (value.isTensor()) {
    if (value.toTensor().is_floating_point()) out->push_back(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList().vec()) {
      if (t.is_floating_point()) out->push_back(t);
    }
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) collect_floating(item, out);
  } else if (value.isTuple()) {
    for (const c10::IValue& item : value.toTupleRef().elements()) collect_floating(item, out);
  }
}

std::vector<at::Tensor> floating_tensors(const c10::IValue& value) {
  std::vector<at::Tensor> out;
  collect_floating(value, &out);
  return out;
}

// `value` with every tensor detached (sharing memory): what leaves this worker carries no graph.
c10::IValue detached(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor().detach();
  if (value.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : value.toTensorList().vec()) out.push_back(t.detach());
    return out;
  }
  if (value.isList()) {
    c10::impl::GenericList out(value.toList().elementType());
    for (const c10::IValue& item : value.toListRef()) out.push_back(detached(item));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& item : value.toTupleRef().elements()) items.push_back(detached(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

// A stage's output as the next stage's inputs: a tuple's elements, or the one value.
c10::IValue as_inputs(c10::IValue output) {
  if (output.isTuple()) return output;
  return c10::ivalue::Tuple::create({std::move(output)});
}

// Completes `done` when `call` does: with None, or with its error unchanged (it already names the
// stage that failed further along).
void complete_with(const FuturePtr& call, const FuturePtr& done) {
  call->addCallback([done](c10::ivalue::Future& f) {
    if (f.hasError()) {
      done->setError(f.exception_ptr());
    } else {
      done->markCompleted(c10::IValue());
    }
  });
}

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

at::Tensor rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

std::int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  std::int64_t n = 0;
  for (const at::Tensor& t : tensors) n += static_cast<std::int64_t>(t.nbytes());
  return n;
}

bool routes_output(const Slot& slot) { return !slot.routes.empty() && slot.index + 1 < slot.count; }

// The stage's forward of one micro-batch; what its backward needs goes into `saved`, with the
// inputs' bytes (the forward keeps them too) as the start of saved.bytes.
c10::IValue forward_keeping(Slot& slot, const remote_module::Flow& flow, c10::IValue inputs,
                            Saved& saved) {
  if (slot.index > 0) {
    for (at::Tensor& t : floating_tensors(inputs)) saved.leaves.push_back(t.requires_grad_());
  }
  if (!slot.routes.empty() && slot.index > 0) {
    remote_module::Gathered gathered =
        remote_module::gather_portals(slot.routes, slot.workers, slot.index, flow, inputs);
    saved.anchors = std::move(gathered.anchors);
    inputs = std::move(gathered.inputs);
  }
  saved.bytes = bytes_of(floating_tensors(inputs));
  c10::IValue output;
  remote_module::ForwardPassScope pass({flow.id, /*recompute=*/false});
  if (slot.checkpoint) {
    saved.rng_state = rng_state();
    saved.inputs = inputs;
    torch::NoGradGuard no_grad;
    output = remote_module::forward_stage_here(slot.module, inputs);
  } else {
    output = remote_module::forward_stage_here(slot.module, inputs);
  }
  if (slot.index + 1 == slot.count && !output.isTensor()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("the last stage must return one tensor for the loss, not {}",
                            output.tagKind()));
  }
  return output;
}

// On a last stage that computes the loss: the micro-batch's share of it, kept for its backward.
// Returns the number of micro-batches in the step.
std::int64_t keep_loss_share(Slot& slot, const remote_module::Flow& flow, const c10::IValue& output,
                             Saved& saved) {
  const std::int64_t step_count = take_targets(slot, flow.id, flow.microbatch, &saved);
  at::Tensor share = loss_share(slot, output, saved);
  if (!slot.checkpoint && !share.requires_grad()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("the loss \"{}\" must be computed from the output", slot.loss_name));
  }
  saved.loss_value = share.item<double>();
  if (!slot.checkpoint) saved.loss = share * saved.scale;
  return step_count;
}

void keep_saved(Slot& slot, const remote_module::Flow& flow, Saved saved) {
  std::lock_guard<std::mutex> lock(slot.mutex);
  slot.activation_bytes += saved.bytes;
  slot.activation_peak = std::max(slot.activation_peak, slot.activation_bytes);
  slot.saved[{flow.id, flow.microbatch}] = std::move(saved);
}

// On the compute thread.
void run_forward(const SlotPtr& slot, std::int64_t context, std::int64_t microbatch,
                 c10::IValue inputs, const FuturePtr& done) {
  std::int64_t start = now_ns();
  std::int64_t live_before = core::tensor_memory().live_bytes;
  const remote_module::Flow flow{context, microbatch};
  try {
    Saved saved;
    c10::IValue output = forward_keeping(*slot, flow, std::move(inputs), saved);
    const bool own_loss = computes_loss(*slot);
    const std::int64_t step_count = own_loss ? keep_loss_share(*slot, flow, output, saved) : 0;
    const std::int64_t output_bytes = bytes_of(floating_tensors(output));
    if (routes_output(*slot)) {
      remote_module::offer_portals(slot->routes, slot->index, flow, output, slot->checkpoint);
      // A recomputed stage joins them in backward, where its graph is made.
      at::AutoGradMode grad_mode(!slot->checkpoint && at::GradMode::is_enabled());
      output = remote_module::join_portals(slot->routes, slot->workers, slot->index, flow, output);
    }
    if (!slot->checkpoint) saved.output = output;
    // What the forward left allocated (its graph's saved tensors and the output; a
    // checkpointed stage's output goes once sent) plus the inputs, counted already. The compute
    // thread runs one thing at a time, so the difference is this forward's.
    saved.bytes +=
        core::tensor_memory().live_bytes - live_before - (slot->checkpoint ? output_bytes : 0);
    keep_saved(*slot, flow, std::move(saved));
    std::int64_t computed = now_ns();
    if (own_loss) {
      record(*slot, kForwardEvent, microbatch, start, computed);
      done->markCompleted(c10::IValue());
      start_own_backwards(slot, context, microbatch, step_count);
      return;
    }
    const bool last = slot->index + 1 == slot->count;
    FuturePtr call = last ? rpc::rpc_async(slot->master, "ferry.pipeline.output",
                                           {slot->pipeline, context, microbatch, detached(output)})
                          : rpc::rpc_async(slot->next, "ferry.pipeline.forward",
                                           {slot->pipeline, slot->index + 1, microbatch,
                                            as_inputs(detached(output))});
    record(*slot, kForwardEvent, microbatch, start, computed);
    record(*slot, kSendForwardEvent, microbatch, computed, now_ns());
    complete_with(call, done);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(slot->mutex);
      slot->saved.erase({context, microbatch});
    }
    done->setError(failure_in(*slot, "forward", microbatch));
    release_place(*slot);
  }
}

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

void check_args(const std::vector<c10::IValue>& args, const char* function, size_t ints,
                bool (c10::IValue::*last)() const, const char* last_name) {
  bool ok = args.size() == ints + 1 && (args[ints].*last)();
  for (size_t i = 0; ok && i < ints; ++i) ok = args[i].isInt();
  if (!ok) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("{} takes {} ints and {}", function, ints, last_name));
  }
}

}  // namespace

std::exception_ptr failure_in(const Slot& slot, const char* what, std::int64_t microbatch) {
  rpc::Failure failure = rpc::failure_of(std::current_exception());
  return std::make_exception_ptr(
      Error(failure.kind,
            fmt::format("{} of micro-batch {} at stage {} (\"{}\") on worker \"{}\": {}", what,
                        microbatch, slot.index, slot.type, rpc::self().name, failure.message),
            "", failure.worker));
}

bool has_place(const Slot& slot) {
  return slot.in_flight + static_cast<std::int64_t>(slot.deferred.size()) < slot.limit;
}

// Parked forwards are posted under the slot's mutex, so that no forward admitted meanwhile
// overtakes them.
void admit_parked(Slot& slot) {
  while (!slot.parked.empty() && has_place(slot)) {
    core::post_to_compute_thread(std::move(slot.parked.front().work));
    slot.parked.pop_front();
    ++slot.in_flight;
  }
}

void release_place(Slot& slot) {
  std::lock_guard<std::mutex> lock(slot.mutex);
  if (slot.in_flight > 0) --slot.in_flight;  // a discard may have reset it meanwhile
  admit_parked(slot);
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

namespace {

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

std::int64_t context_or_throw(const char* function) {
  std::int64_t context = dist_autograd::current_context_id();
  if (context == 0) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("{} must be called inside a distributed autograd context", function));
  }
  return context;
}

SlotTable<Slot>& slots() {
  static SlotTable<Slot> table;
  return table;
}

SlotPtr slot_of(std::int64_t pipeline, std::int64_t index) {
  return slots().at(pipeline, index, rpc::self().name);
}

void record(Slot& slot, EventKind kind, std::int64_t microbatch, std::int64_t start,
            std::int64_t end) {
  std::lock_guard<std::mutex> lock(slot.mutex);
  slot.events.insert(slot.events.end(), {kind, microbatch, start, end});
}

void fail_abandoned(std::vector<Parked>& abandoned) {
  for (Parked& p : abandoned) {
    p.done->setError(std::make_exception_ptr(
        Error(ErrorKind::RemoteException, "the pipeline step was abandoned")));
  }
}

void install_stage_steps(rpc::FunctionRegistry& registry) {
  registry.add_async("ferry.pipeline.forward", [](std::vector<c10::IValue>& args) {
    std::int64_t arrived = now_ns();
    check_args(args, "ferry.pipeline.forward", 3, &c10::IValue::isTuple, "a tuple of inputs");
    std::int64_t context = context_or_throw("ferry.pipeline.forward");
    SlotPtr slot = slot_of(args[0].toInt(), args[1].toInt());
    std::int64_t microbatch = args[2].toInt();
    auto done = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    auto work = [slot, context, microbatch, inputs = args[3], done] {
      run_forward(slot, context, microbatch, inputs, done);
    };
    std::vector<Parked> abandoned;
    {
      // Posted under the mutex, so that the compute thread gets them in the order decided here.
      std::lock_guard<std::mutex> lock(slot->mutex);
      slot->events.insert(slot->events.end(), {kArriveForwardEvent, microbatch, arrived, arrived});
      for (Parked& ready : slot->forwards.take(context, microbatch, {work, done}, &abandoned)) {
        if (slot->parked.empty() && has_place(*slot)) {
          ++slot->in_flight;
          core::post_to_compute_thread(std::move(ready.work));
        } else {
          slot->parked.push_back(std::move(ready));
        }
      }
    }
    fail_abandoned(abandoned);
    return done;
  });
  registry.add_async("ferry.pipeline.backward", [](std::vector<c10::IValue>& args) {
    std::int64_t arrived = now_ns();
    check_args(args, "ferry.pipeline.backward", 3, &c10::IValue::isTensorList,
               "a list of gradients");
    std::int64_t context = context_or_throw("ferry.pipeline.backward");
    SlotPtr slot = slot_of(args[0].toInt(), args[1].toInt());
    std::int64_t microbatch = args[2].toInt();
    auto done = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    auto work = [slot, context, microbatch, grads = args[3].toTensorVector(), done] {
      run_backward(slot, context, microbatch, grads, done);
    };
    std::vector<Parked> abandoned;
    {
      std::lock_guard<std::mutex> lock(slot->mutex);
      slot->events.insert(slot->events.end(), {kArriveBackwardEvent, microbatch, arrived, arrived});
      for (Parked& ready : slot->backwards.take(context, microbatch, {work, done}, &abandoned)) {
        core::post_to_compute_thread(std::move(ready.work));
      }
    }
    fail_abandoned(abandoned);
    return done;
  });
}

void install(rpc::FunctionRegistry& registry) {
  remote_module::install(registry);
  dist_autograd::install(registry);
  if (registry.contains("ferry.pipeline.setup")) return;
  install_stage_control(registry);
  install_stage_steps(registry);
  install_stage_weights(registry);
  install_stage_loss(registry);
  install_master_inbox(registry);
}

}  // namespace ferry::pipeline
