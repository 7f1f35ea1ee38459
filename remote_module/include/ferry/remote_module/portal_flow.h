// The worker's side of portals (ferry/remote_module/portal.h): how a stage's worker hands the
// elements of its output that skip stages to their consumers, and their gradients back, for
// remote_module's own chains and for a layer that drives stages a micro-batch at a time (the
// pipeline).
// These functions run on a stage's worker, on the thread that runs the stage's forward or
// backward (never an agent's loop thread).
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/remote_module/portal.h"

namespace ferry::remote_module {

// One pass of one batch, or of one micro-batch of it, through a chain: portals are keyed by it.
// Plain passes draw `id` from new_flow_id() and have no micro-batch; pipelined ones use the step's
// autograd context and the micro-batch.
struct Flow {
  int64_t id = 0;
  int64_t microbatch = -1;
};
// Unique among the flows that any process of the world starts.
int64_t new_flow_id();

// On stage `index`'s worker, before its forward: its inputs (a tuple of its one list), from `main`
// (what the stage before sent it: a tuple of one list, its elements routed to this stage in their
// order) and the portal elements routed to it, taken from their producers' workers (`workers`:
// each stage's worker), each in its position. In grad mode a portal element's grad_fn offers its
// gradient to its producer; that node leads to a leaf of no elements in `anchors`, and an explicit
// backward must ask for the anchors' gradients (none), or the node does not run. Throws
// rpc::Error naming the stage and what did not fit or could not be taken.
struct Gathered {
  c10::IValue inputs;
  std::vector<at::Tensor> anchors;
};
Gathered gather_portals(const Routes& routes, const std::vector<std::string>& workers,
                        int64_t index, const Flow& flow, const c10::IValue& main);

// On stage `index`'s worker, after its forward: offers each element of its `output` list that
// skips the next stage to its consumer. The consumer gives back the gradient of each that requires
// grad, or, when the stage is `recomputed` in backward (its first forward ran without grad), of
// each floating-point one. Throws rpc::Error naming the stage when its output is not a list its
// routes fit.
void offer_portals(const Routes& routes, int64_t index, const Flow& flow, const c10::IValue& output,
                   bool recomputed = false);
// The elements of `output` routed to the next stage, in order, as a list. In grad mode they are
// joined to the portal elements: their backward takes the portal elements' gradients from their
// consumers' workers and adds them in, so one backward covers every element. (A stage that
// recomputes its forward in backward calls this again, and offer_portals only the first time.)
c10::IValue join_portals(const Routes& routes, const std::vector<std::string>& workers,
                         int64_t index, const Flow& flow, const c10::IValue& output);

// Empties this worker's mailbox of what pipelined flows left (after a failed step).
void drop_pipelined_portals();

}  // namespace ferry::remote_module
