// The weight passes of the zero-bubble schedule on a stage's worker. A micro-batch's backward runs
// its input pass at once, so the stage before gets its gradients as soon as they exist; its weight
// pass waits in the slot's queue and runs on the compute thread in turns of a few milliseconds.
// Each turn goes to the back of the compute thread's queue when it ends, so a forward or input pass
// that arrived meanwhile runs first: the weight passes fill the time the stage would otherwise
// wait. A forward waits while the stage holds its limit of micro-batches, those whose weight pass
// waits counted but for one on the last stage (has_place), which bounds what the deferred passes
// hold. The master asks for a step's weight passes ("ferry.pipeline.weights") before the
// optimizer's step.
//
// Thread rules: weight passes run on the compute thread; the slot's queue and waiters are guarded
// by its mutex; "ferry.pipeline.weights" runs on a pool thread and does not wait there.
#include <fmt/format.h>

#include <algorithm>

#include "ferry/core/compute_thread.h"
#include "ferry/dist_autograd/context.h"
#include "ferry/rpc/error.h"
#include "pipeline/stage_slot.h"

namespace ferry::pipeline {
namespace {

using rpc::Error;
using rpc::ErrorKind;
using rpc::FuturePtr;

// How long one turn of weight passes holds the compute thread.
constexpr std::int64_t kWeightTurnNs = 2'000'000;

using Ready = std::vector<std::pair<FuturePtr, std::exception_ptr>>;

void run_weights(const SlotPtr& slot);

// Under the slot's mutex.
void post_weights(const SlotPtr& slot) {
  slot->weights_posted = true;
  core::post_to_compute_thread([slot] { run_weights(slot); });
}

// The masters whose step has no weight pass left here, or whose step's failed, taken out of the
// waiters (under the slot's mutex).
Ready ready_waiters(Slot& slot) {
  Ready ready;
  auto waiting = [&slot](std::int64_t context) {
    return std::any_of(slot.deferred.begin(), slot.deferred.end(),
                       [context](const DeferredWeights& d) { return d.context == context; });
  };
  auto& waiters = slot.weight_waiters;
  for (auto it = waiters.begin(); it != waiters.end();) {
    const bool failed = slot.weight_failure.second && slot.weight_failure.first == it->first;
    if (!failed && waiting(it->first)) {
      ++it;
      continue;
    }
    ready.emplace_back(it->second, failed ? slot.weight_failure.second : nullptr);
    it = waiters.erase(it);
  }
  return ready;
}

void complete(const Ready& ready) {
  for (const auto& [future, error] : ready) {
    if (error) {
      future->setError(error);
    } else {
      future->markCompleted(c10::IValue());
    }
  }
}

// One turn: the front micro-batch's weight pass, node by node, for at most kWeightTurnNs.
void run_weights(const SlotPtr& slot) {
  DeferredWeights front;
  {
    std::lock_guard<std::mutex> lock(slot->mutex);
    if (slot->deferred.empty()) {
      slot->weights_posted = false;
      return;
    }
    front = slot->deferred.front();
  }
  const std::int64_t start = now_ns();
  const std::int64_t context = front.context;
  bool left = true;
  std::exception_ptr failure;
  try {
    do {
      left = front.backward->weight_step(into_context(context));
    } while (left && now_ns() - start < kWeightTurnNs);
  } catch (...) {
    failure = failure_in(*slot, "weight pass", front.microbatch);
    left = false;
  }
  record(*slot, kWeightEvent, front.microbatch, start, now_ns());
  bool finished = false;
  Ready ready;
  {
    std::lock_guard<std::mutex> lock(slot->mutex);
    // A discard may have emptied the queue meanwhile; then the place is no longer this pass's.
    auto& deferred = slot->deferred;
    if (!left && !deferred.empty() && deferred.front().backward == front.backward) {
      slot->activation_bytes -= front.bytes;
      deferred.pop_front();
      finished = true;
    }
    if (failure) {
      slot->weight_failure = {context, failure};
      deferred.erase(
          std::remove_if(deferred.begin(), deferred.end(),
                         [context](const DeferredWeights& d) { return d.context == context; }),
          deferred.end());
    }
    ready = ready_waiters(*slot);
    if (finished) admit_parked(*slot);
    if (!deferred.empty()) {
      post_weights(slot);
    } else {
      slot->weights_posted = false;
    }
  }
  complete(ready);
}

}  // namespace

SplitBackward::Deliver into_context(std::int64_t context) {
  return [context](const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
    dist_autograd::accumulate_gradients(context, params, grads, /*handed_over=*/true);
  };
}

void defer_weights(const SlotPtr& slot, DeferredWeights deferred) {
  std::lock_guard<std::mutex> lock(slot->mutex);
  slot->activation_bytes += deferred.bytes;
  slot->activation_peak = std::max(slot->activation_peak, slot->activation_bytes);
  slot->deferred.push_back(std::move(deferred));
  if (!slot->weights_posted) post_weights(slot);
}

std::vector<FuturePtr> drop_deferred_weights(Slot& slot) {
  slot.deferred.clear();
  slot.weight_failure = {0, nullptr};
  std::vector<FuturePtr> waiting;
  for (auto& [context, future] : slot.weight_waiters) waiting.push_back(future);
  slot.weight_waiters.clear();
  return waiting;
}

void install_stage_weights(rpc::FunctionRegistry& registry) {
  // Answers when every weight pass of the caller's step is done here.
  registry.add_async("ferry.pipeline.weights", [](std::vector<c10::IValue>& args) {
    if (args.size() != 2 || !args[0].isInt() || !args[1].isInt()) {
      throw Error(ErrorKind::InvalidArgument, "ferry.pipeline.weights takes 2 ints");
    }
    const std::int64_t context = context_or_throw("ferry.pipeline.weights");
    SlotPtr slot = slot_of(args[0].toInt(), args[1].toInt());
    auto done = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    Ready ready;
    {
      std::lock_guard<std::mutex> lock(slot->mutex);
      slot->weight_waiters.emplace_back(context, done);
      ready = ready_waiters(*slot);
    }
    complete(ready);
    return done;
  });
}

}  // namespace ferry::pipeline
