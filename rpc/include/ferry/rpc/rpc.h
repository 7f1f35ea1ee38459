// The process-wide API, mirroring torch.distributed.rpc: one default agent per process.
//
//   ferry::rpc::register_function("add", [](at::Tensor a, at::Tensor b) { return a + b; });
//   ferry::rpc::init();                       // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//   at::Tensor sum = ferry::rpc::rpc_sync<at::Tensor>("worker1", "add", {a, b});
//   ferry::rpc::shutdown();
//
// Every function may be called from any thread except the agent's loop thread.
#pragma once

#include "ferry/rpc/agent.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/options.h"
#include "ferry/rpc/registry.h"
#include "ferry/rpc/rref.h"
#include "ferry/rpc/worker_info.h"

namespace ferry::rpc {

// Starts the default agent; throws Error(Init). Register functions before, so that they exist
// as soon as peers can call.
void init(Options options = {});
// Graceful by default (see Agent::shutdown); the default agent is gone afterwards.
void shutdown(bool graceful = true);
// The default agent; throws Error(Shutdown) if init() has not run.
Agent& agent();
bool is_initialized();

template <typename F>
void register_function(const std::string& name, F fn) {
  default_registry().add(name, std::move(fn));
}

inline c10::IValue rpc_sync(const std::string& to, const std::string& function,
                            std::vector<c10::IValue> args = {},
                            std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
  return agent().call_sync(to, function, std::move(args), timeout);
}

// The same with the result as a `T` (rpc_sync<at::Tensor>(...)); a result of another type is
// Error(InvalidArgument) naming the function, the worker and what came back.
template <typename T>
T rpc_sync(const std::string& to, const std::string& function, std::vector<c10::IValue> args = {},
           std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
  c10::IValue value = rpc_sync(to, function, std::move(args), timeout);
  try {
    return value.to<T>();
  } catch (const c10::Error&) {
    throw Error(ErrorKind::InvalidArgument,
                "call \"" + function + "\" to worker \"" + to + "\" returned a " + value.tagKind() +
                    ", not the type asked for",
                "", to);
  }
}

inline FuturePtr rpc_async(const std::string& to, const std::string& function,
                           std::vector<c10::IValue> args = {},
                           std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
  return agent().call_async(to, function, std::move(args), timeout);
}

inline RRefPtr remote(const std::string& to, const std::string& function,
                      std::vector<c10::IValue> args = {},
                      std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
  return agent().remote(to, function, std::move(args), timeout);
}

inline const std::vector<WorkerInfo>& workers() { return agent().workers(); }
inline const WorkerInfo& worker(const std::string& name) { return agent().worker(name); }
inline const WorkerInfo& self() { return agent().self(); }

}  // namespace ferry::rpc
