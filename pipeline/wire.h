// What a Pipeline and its stages' workers say to each other. Internal to pipeline/.
//
//   setup(pipeline, stage, stages, module, previous, next, master, in_flight_limit, checkpoint,
//         routes, workers, loss, backward_at_once, split_backward)
//   targets(pipeline, stage, samples, scale, targets) master to the last stage with a loss
//   forward(pipeline, stage, micro-batch, inputs)     stage to stage; the last stage sends
//   output(pipeline, context, micro-batch, output)    its output to the master, or with a loss,
//                                                     the loss share once the backward is done
//   failed(pipeline, context, micro-batch, kind, message, cause, worker)
//                                                     a backward the last stage started failed
//   backward(pipeline, stage, micro-batch, grads)     master to the last stage, then stage to stage
//   weights(pipeline, stage)                          master to each stage (zero-bubble schedule):
//                                                     answers once the step's weight passes are
//                                                     done
//   events(pipeline, stage), memory(pipeline, stage, reset), discard(pipeline),
//   teardown(pipeline), clock(), kept()
//
// forward and backward answer when the rest of their chain has: a failure anywhere travels back
// to the master along it.
#pragma once

#include <chrono>
#include <cstdint>

#include "ferry/rpc/registry.h"

namespace ferry::pipeline {

// What a stage's worker records, one row per event: kind, micro-batch, start, end (its own
// steady clock, nanoseconds). Arrivals are instants: a request's handler began.
enum EventKind : std::int64_t {
  kForwardEvent,
  kBackwardEvent,
  kSendForwardEvent,
  kSendBackwardEvent,
  kArriveForwardEvent,
  kArriveBackwardEvent,
  kWeightEvent,  // a turn of deferred weight passes (zero-bubble schedule)
};
inline constexpr int kEventFields = 4;

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline double seconds(std::int64_t ns) { return static_cast<double>(ns) * 1e-9; }

void install_master_inbox(rpc::FunctionRegistry& registry);  // master_step.cc

}  // namespace ferry::pipeline
