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
// Routes are value types. What a stage's worker does with them (remote_module/portal_flow.h) is
// internal to remote_module and the pipeline.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

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

}  // namespace ferry::remote_module
