// Functions every process of the multi-process tests serves, so any of them can call any other,
// together with the stage functions and the test stages (tests/support/test_stages.h).
#pragma once

#include "ferry/rpc/registry.h"

namespace ferry::testing {

// add(a, b) -> a + b; echo(v) -> v; sleep_ms(ms) -> ms after sleeping; fail(text) throws text;
// whoami() -> the serving worker's name; pid() -> its process id;
// relay(to, function, arg) -> rpc_sync(to, function, [arg]) from inside the handler (nested);
// relay_async(to, function, arg) -> the same without holding a pool thread while waiting;
// owned_rrefs() -> values this worker owns; rref_value(rref) -> rref.to_here();
// rref_owner(rref) -> the owner's name; make_remote(to, function, arg) -> remote(...) as an RRef.
// For distributed autograd: double_it(x) -> 2 x; chain(hops, x) -> 2 x, passed on through
// the workers named in `hops` (each doubles it again); fail_backward(x) -> x, whose backward
// throws "injected backward failure"; slow_backward(x, ms) -> x, whose backward sleeps `ms`.
// sleeping() -> the sleeps of sleep_ms and slow_backward under way here: a test that acts on a
// call in flight waits for it to say so, never for a time.
// Every process also serves the stage functions, the U-Net stages and distributed autograd.
void register_test_functions(rpc::FunctionRegistry& registry);

}  // namespace ferry::testing
