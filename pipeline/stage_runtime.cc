// A stage's worker during pipelined steps. Each micro-batch's forward runs under grad mode and its
// graph is kept here, keyed by the step's autograd context and the micro-batch, until that
// micro-batch's backward frees it; nothing of the graph crosses the wire (tensors are sent
// detached), so distributed autograd records nothing and each backward is a local one.
//
// Requests do not hold pool threads while they wait their turn: forward and backward are posted
// to the compute thread, which runs them in arrival order, and the handler answers with a future
// that completes when the rest of the chain has. Under 1F1B a stage takes at most its in-flight
// limit of forwards; further ones are parked until a backward frees a place, which is what makes
// each stage alternate forward and backward. The backward itself is in stage_backward.cc.
#include <fmt/format.h>
#include <torch/torch.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "ferry/core/compute_thread.h"
#include "ferry/core/process_memory.h"
#include "ferry/dist_autograd/context.h"
#include "ferry/pipeline/pipeline.h"
#include "ferry/remote_module/portal.h"
#include "ferry/remote_module/portal_flow.h"
#include "ferry/remote_module/stage_here.h"
#include "ferry/remote_module/stage_host.h"
#include "ferry/remote_module/step_statistics.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "pipeline/stage_slot.h"

namespace ferry::pipeline {
namespace {

using rpc::Error;
using rpc::ErrorKind;
using rpc::FuturePtr;

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

// A forward that was running when its step was discarded keeps nothing: the discard has already
// cleared what the step left.
void keep_saved(Slot& slot, const remote_module::Flow& flow, Saved saved) {
  std::lock_guard<std::mutex> lock(slot.mutex);
  if (slot.forwards.discarded(flow.id)) {
    throw Error(ErrorKind::RemoteException, "the pipeline step was abandoned while it ran");
  }
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

std::vector<at::Tensor> floating_tensors(const c10::IValue& value) {
  std::vector<at::Tensor> out;
  collect_floating(value, &out);
  return out;
}

void complete_with(const FuturePtr& call, const FuturePtr& done) {
  call->addCallback([done](c10::ivalue::Future& f) {
    if (f.hasError()) {
      done->setError(f.exception_ptr());
    } else {
      done->markCompleted(c10::IValue());
    }
  });
}

bool routes_output(const Slot& slot) { return !slot.routes.empty() && slot.index + 1 < slot.count; }

std::exception_ptr failure_in(const Slot& slot, const char* what, std::int64_t microbatch) {
  rpc::Failure failure = rpc::failure_of(std::current_exception());
  return std::make_exception_ptr(
      Error(failure.kind,
            fmt::format("{} of micro-batch {} at stage {} (\"{}\") on worker \"{}\": {}", what,
                        microbatch, slot.index, slot.type, rpc::self().name, failure.message),
            "", failure.worker));
}

bool has_place(const Slot& slot) {
  auto waiting = static_cast<std::int64_t>(slot.deferred.size());
  // The last stage's place is one micro-batch: were its waiting weight pass to take it, the next
  // forward and input pass would wait for that pass, and the stage before for them.
  if (slot.index + 1 == slot.count && waiting > 0) --waiting;
  return slot.in_flight + waiting < slot.limit;
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
    // Bound here: a parked forward is posted later by whichever thread frees its place, which
    // may be in no autograd context, and its send on must carry this one.
    auto work = core::as_if_here([slot, context, microbatch, inputs = args[3], done] {
      run_forward(slot, context, microbatch, inputs, done);
    });
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
    auto work = core::as_if_here([slot, context, microbatch, grads = args[3].toTensorVector(),
                                  done] { run_backward(slot, context, microbatch, grads, done); });
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
