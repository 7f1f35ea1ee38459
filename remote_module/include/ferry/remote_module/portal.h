// Portals: elements of a stage's output list that go straight to the later stage that uses them
// (a U-Net's skip features), not through every stage between (torchgpipe's name for the same
// idea). A stage whose output is a list of tensors may route each element to any later stage of
// its chain; each stage gets, as its one list argument, the elements routed to it in their
// positions, whichever stage they came from.
//
// Forward: the producer offers each portal element in its worker's mailbox before its main output
// goes on to the next stage; the consumer, which runs later in the chain, takes it from there when
// its own forward starts. Backward: the consumer's graph offers each portal element's gradient in
// the consumer's mailbox as its backward computes it, before its input gradients go on; the
// producer's graph takes it from there and joins it to its main output's gradients, so each stage
// runs one backward per step whichever way its outputs left, and frees its activations as it does.
// So a skip or its gradient is only ever held where it would be anyway: by the producer, whose
// graph keeps the skip until its backward, and by the consumer, until the producer asks.
//
// Routes are value types. The worker-side functions below run on a stage's worker, on the thread
// that runs the stage's forward or backward (never an agent's loop thread).
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/rpc/registry.h"

namespace ferry::remote_module {

// Where one element of a stage's output list goes: a stage (its position in the chain) and the
// position in that stage's input list.
struct Hop {
  int64_t stage = 0;
  int64_t position = 0;
  bool operator==(const Hop& other) const {
    return stage == other.stage && position == other.position;
  }
};

// Per stage of a chain, where each element of its output list goes; the last stage's entry is
// empty (its output is the chain's). Empty Routes: each stage's whole output goes to the next.
using Routes = std::vector<std::vector<Hop>>;

// Throws rpc::Error(InvalidArgument) naming the stage and element of the first wrong hop: not to a
// later stage, past the last, or into a position of a stage's input that another element fills
// too; or naming the stage and position that no element fills.
void check_routes(const Routes& routes, size_t stages);
// How many elements a stage's input list has under `routes` (the first stage's: none routed).
int64_t routed_input_size(const Routes& routes, int64_t stage);

c10::IValue routes_to_ivalue(const Routes& routes);
Routes routes_from_ivalue(const c10::IValue& value);

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

// Adds the "ferry.portal.*" functions to `registry`.
void install_portal_functions(rpc::FunctionRegistry& registry);

}  // namespace ferry::remote_module
