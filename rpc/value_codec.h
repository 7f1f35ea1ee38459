// The values of messages on the wire (private to rpc/): the table of tensor dtypes, and IValues
// into and out of an envelope's wire::Value. A tensor is encoded as an index into the frame's
// tensors, whose bytes travel after the envelope.
//
// Thread rules: none of its own; call from any thread.
#pragma once

#include <ATen/core/ivalue.h>

#include <vector>

#include "rpc/frame.h"
#include "rpc/wire.capnp.h"

namespace ferry::rpc {

wire::DType dtype_to_wire(at::ScalarType type);
// False for a dtype this build does not know.
bool dtype_from_wire(wire::DType type, at::ScalarType* out);

// Encodes `value` into `out`, appending each tensor it holds to `tensors` (on the CPU, dense and
// contiguous; a contiguous view stays a view) and whether it requires grad to `requires_grad`.
// RRefs are forked for the worker of rank `to_rank` through `rrefs`. Throws
// Error(InvalidArgument) for a value that cannot be sent or is nested deeper than `max_depth`.
void encode_value(const c10::IValue& value, wire::Value::Builder out, int max_depth,
                  RRefCodec* rrefs, int to_rank, std::vector<at::Tensor>* tensors,
                  std::vector<bool>* requires_grad);

// The value `in` describes, its tensors taken from `tensors`. Throws Error(BadFrame) for one
// that is malformed: out-of-range tensor indices, typed containers holding other types,
// unhashable dict keys, RRefs where `rrefs` is null, nesting deeper than `max_depth`.
c10::IValue decode_value(wire::Value::Reader in, const std::vector<at::Tensor>& tensors,
                         int max_depth, RRefCodec* rrefs);

}  // namespace ferry::rpc
