// One stage of one pipeline as its worker holds it during pipelined steps: what stage_runtime.cc
// runs micro-batches on and stage_control.cc sets up, reports on and tears down. Internal to
// pipeline/. A Slot's fields after its mutex are guarded by it; the others are set once at set-up.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ferry/remote_module/loss.h"
#include "ferry/remote_module/portal.h"
#include "ferry/rpc/rpc.h"
#include "pipeline/in_order.h"
#include "pipeline/slot_table.h"
#include "pipeline/split_backward.h"
#include "pipeline/wire.h"

namespace ferry::pipeline {

// What one micro-batch's forward left for its backward.
struct Saved {
  std::vector<at::Tensor> leaves;   // the inputs that require grad (none on the first stage)
  std::vector<at::Tensor> anchors;  // of the inputs that came by portal (gather_portals)
  c10::IValue inputs;               // checkpointed stages only: to run forward again
  c10::IValue output;               // the output, graph attached (not for checkpointed stages)
  at::Tensor rng_state;             // checkpointed stages: the random state of the first run
  // The last stage with a loss: the micro-batch's targets, its share of the batch, the step's
  // scale, its loss share (scaled, graph attached; not for checkpointed stages) and that value.
  at::Tensor target;
  double share = 0, scale = 1;
  at::Tensor loss;
  double loss_value = 0;
  std::int64_t bytes = 0;  // what the micro-batch holds here until its backward
};

// A step's targets on the last stage with a loss, until each of its forwards has taken its own.
struct StepTargets {
  std::vector<at::Tensor> microbatches;
  double samples = 0;
  double scale = 1;
  std::int64_t forwards_done = 0;
};

struct Parked {
  std::function<void()> work;
  rpc::FuturePtr done;
};

// A micro-batch whose input pass ran under the zero-bubble schedule, waiting for its weight pass.
struct DeferredWeights {
  std::int64_t context = 0;
  std::int64_t microbatch = 0;
  std::shared_ptr<SplitBackward> backward;
  std::int64_t bytes = 0;  // what its graph holds here until the weight pass is done
};

// One stage of one pipeline on this worker.
struct Slot {
  std::int64_t pipeline = 0;
  std::int64_t index = 0;
  std::int64_t count = 0;
  rpc::RRefPtr module;
  std::string type;
  std::string previous, next, master;
  std::int64_t limit = 0;  // forwards whose backward has not run yet (see has_place)
  bool checkpoint = false;
  remote_module::Routes routes;      // empty: the whole output goes to the next stage
  std::vector<std::string> workers;  // of every stage, for portals
  // The last stage's loss, when it computes it; it then starts each micro-batch's backward itself:
  // at once (1F1B) or once the step's last forward is done (GPipe).
  remote_module::LossFunction loss;
  std::string loss_name;
  bool backward_at_once = true;
  // The zero-bubble schedule: each backward's weight pass is deferred (deferred_weights.cc).
  bool split_backward = false;

  std::mutex mutex;                                              // guards what follows
  std::map<std::pair<std::int64_t, std::int64_t>, Saved> saved;  // (context, micro-batch)
  std::map<std::int64_t, StepTargets> step_targets;              // by context
  std::int64_t in_flight = 0;
  std::deque<Parked> parked;
  InOrder<Parked> forwards, backwards;   // micro-batch order
  std::vector<std::int64_t> events;      // kEventFields per event
  std::int64_t activation_bytes = 0;     // held by the micro-batches in `saved`
  std::int64_t activation_peak = 0;      // the most since the last reset
  std::deque<DeferredWeights> deferred;  // in micro-batch order
  bool weights_posted = false;           // a weight pass is on the compute thread's queue
  // Masters waiting for a step's weight passes, by context; a step whose weight pass failed.
  std::vector<std::pair<std::int64_t, rpc::FuturePtr>> weight_waiters;
  std::pair<std::int64_t, std::exception_ptr> weight_failure{0, nullptr};
};
using SlotPtr = std::shared_ptr<Slot>;

// Every slot of this worker, by pipeline and stage.
SlotTable<Slot>& slots();
// The slot of stage `index` of `pipeline`; throws rpc::Error naming this worker if there is none.
SlotPtr slot_of(std::int64_t pipeline, std::int64_t index);
// Adds an event to the slot's record (takes its mutex).
void record(Slot& slot, EventKind kind, std::int64_t microbatch, std::int64_t start,
            std::int64_t end);
// Fails the requests of a step that was given up.
void fail_abandoned(std::vector<Parked>& abandoned);

// stage_backward.cc: micro-batch `microbatch`'s backward, on the compute thread, from the
// gradients of its outputs (none on the last stage with a loss); `done` completes when the
// stages before have run theirs.
void run_backward(const SlotPtr& slot, std::int64_t context, std::int64_t microbatch,
                  std::vector<at::Tensor> grads, const rpc::FuturePtr& done);

// stage_runtime.cc, for the forward and the backward:
// The step's autograd context on this thread; throws rpc::Error naming `function` without one.
std::int64_t context_or_throw(const char* function);
// The floating-point tensors of a stage's inputs or outputs, in the order the wire carries them;
// gradients travel in this order.
std::vector<at::Tensor> floating_tensors(const c10::IValue& value);
// Completes `done` when `call` does: with None, or with its error unchanged (it already names the
// stage that failed further along).
void complete_with(const rpc::FuturePtr& call, const rpc::FuturePtr& done);
// Whether the stage's output goes out by portals and routes (any stage but the last, with routes).
bool routes_output(const Slot& slot);

// stage_loss.cc: the last stage when it computes the loss.
bool computes_loss(const Slot& slot);
// Puts the micro-batch's targets, share and scale into `saved`. Returns the step's number of
// micro-batches if this was its last forward here, else 0.
std::int64_t take_targets(Slot& slot, std::int64_t context, std::int64_t microbatch, Saved* saved);
// The micro-batch's share of the batch's loss, computed from the last stage's output.
at::Tensor loss_share(const Slot& slot, const c10::IValue& output, const Saved& saved);
// After a forward on the last stage with a loss: 1F1B runs its backward next; GPipe runs every
// backward of the step, in order, once its last forward (`step_count` > 0) is done.
void start_own_backwards(const SlotPtr& slot, std::int64_t context, std::int64_t microbatch,
                         std::int64_t step_count);

// deferred_weights.cc: the weight pass of a micro-batch whose input pass just ran, queued behind
// the forwards and backwards on the compute thread; parked forwards may start once it is done.
void defer_weights(const SlotPtr& slot, DeferredWeights deferred);
// Adds what a split backward computes to the gradients of autograd context `context`.
SplitBackward::Deliver into_context(std::int64_t context);
// After a discard: the deferred passes go, and the masters waiting for them are told (under the
// slot's mutex; fail the returned futures outside it).
std::vector<rpc::FuturePtr> drop_deferred_weights(Slot& slot);
// Whether one more forward may start on the slot: fewer than `limit` micro-batches between their
// forward and backward, or whose weight pass waits (zero-bubble schedule; on the last stage, one
// waiting weight pass takes no place). Under the slot's mutex.
bool has_place(const Slot& slot);
// Under the slot's mutex: the parked forwards that have a place now go to the compute thread.
void admit_parked(Slot& slot);
// A forward whose backward has run (or failed) leaves its place to the next parked one.
void release_place(Slot& slot);
// The error that is being handled, said with the micro-batch and the stage.
std::exception_ptr failure_in(const Slot& slot, const char* what, std::int64_t microbatch);

void install_stage_steps(rpc::FunctionRegistry& registry);    // stage_runtime.cc
void install_stage_weights(rpc::FunctionRegistry& registry);  // deferred_weights.cc
void install_stage_loss(rpc::FunctionRegistry& registry);     // stage_loss.cc
void install_stage_control(rpc::FunctionRegistry& registry);  // stage_control.cc

}  // namespace ferry::pipeline
