// Tensors parked on the worker that holds them, for other workers to take straight from there.
// A park is a dict of named tensors owned by an RRef on its worker (made by rpc::remote of a
// function that returns one); the park lives while any copy of that RRef does. A worker that
// needs some of the tensors asks each park's owner for the names it still lacks, so only those
// travel, and they travel once, worker to worker, never through whoever holds the RRefs. A
// layer above installs the function that answers on an owner under a name of its own, on every
// worker of the world.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ferry/rpc/registry.h"
#include "ferry/rpc/rref.h"

namespace ferry::rpc {

using ParkedTensors = c10::Dict<std::string, at::Tensor>;

// On a park's owner: the entries of `names` that `park` holds, taken out of it (what is taken
// is freed there once the taker drops it), moved to CPU memory when `for_peer`, since they are
// about to travel. Throws Error(InvalidArgument) when `park` is not owned here or is no dict of
// tensors. Safe from any thread: takes from one park by several threads at once are serialised.
ParkedTensors take_parked(const RRefPtr& park, const std::vector<std::string>& names,
                          bool for_peer);

// Registers `name` (park, names) -> take_parked(park, names, true): what gather_parked calls on
// other owners.
void install_park_taker(FunctionRegistry& registry, const std::string& name);

// On a park's owner: its first entries in order, taken out of it, as many as `max_bytes` holds
// (one at least while any remain); none once it is empty. Moved to CPU memory.
ParkedTensors take_parked_part(const RRefPtr& park, std::int64_t max_bytes);
// Registers `name` (park, max_bytes) -> take_parked_part(park, max_bytes).
void install_park_part_taker(FunctionRegistry& registry, const std::string& name);
// Every tensor of each of `parks` (once it is made), taken out of it and brought here by calls of
// `take_function` (as install_park_part_taker registers it) of at most `part_bytes` each, a
// larger tensor alone, one call to each park's owner at a time, all owners at once: a big park
// then holds up the other calls on its owner's connection for one part at a time, not for the
// whole of its way. `label` names each park in an error ("stage \"decoder\" on worker \"b\"").
std::vector<ParkedTensors> bring_parks(const std::vector<RRefPtr>& parks,
                                       const std::string& take_function, std::int64_t part_bytes,
                                       const std::function<std::string(std::size_t)>& label);

// Each of `names` from the first of `parks` that holds it: from this worker's own parks
// without a copy, from each other owner by one call of `take_function` (park, names). Names no
// park holds are left out: the caller says what it missed.
ParkedTensors gather_parked(const std::vector<RRefPtr>& parks, std::vector<std::string> names,
                            const std::string& take_function);

// `parks` as one value to send, and back.
c10::IValue parks_value(const std::vector<RRefPtr>& parks);
std::vector<RRefPtr> parks_of(const c10::IValue& value);

}  // namespace ferry::rpc
