// The RPC agent of one process: it joins the world through the rendezvous, listens for peers,
// sends calls and serves the functions of its registry. Resource type: one per process normally,
// owned by ferry::rpc::init() or by the caller of Agent::start().
//
// Thread rules: every public method may be called from any thread except the agent's own loop
// thread. User functions run on the agent's pool, never on the loop thread. Futures returned by
// call_async complete on a pool thread, so their callbacks run there.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/rpc/options.h"
#include "ferry/rpc/registry.h"
#include "ferry/rpc/rref.h"
#include "ferry/rpc/worker_info.h"

namespace ferry::rpc {

FunctionRegistry& default_registry();

class Agent {
 public:
  // Joins the world described by `options` (unset fields from the environment) and serves
  // `registry`, which must outlive the agent. Throws Error(Init) within options.init_timeout,
  // also for a bad FERRY_LOG_LEVEL, FERRY_TENSOR_CACHE_MIB or FERRY_MEMORY_BUDGET_MIB.
  // It changes two things for the whole process, for good: LibTorch's CPU allocator becomes the
  // tensor cache of ferry/core/tensor_cache.h (unless FERRY_TENSOR_CACHE_MIB=0 and no memory
  // budget is set), and SIGPIPE is ignored, so that a write to a dead peer fails instead of
  // ending the process.
  static std::unique_ptr<Agent> start(Options options,
                                      FunctionRegistry& registry = default_registry());
  // Shuts down without the barrier if shutdown() was not called.
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  const WorkerInfo& self() const;
  const std::vector<WorkerInfo>& workers() const;
  // Throws Error(InvalidArgument) listing the known names.
  const WorkerInfo& worker(const std::string& name) const;
  const Options& options() const;
  // The port of the rendezvous store (useful when rank 0 was given port 0).
  int master_port() const;

  // Runs `function` on worker `to` with `args`. The future fails with an rpc::Error naming the
  // worker and function on a remote exception, an unknown function, the deadline (default
  // Options::rpc_timeout), or the peer dying. Throws Error(InvalidArgument) at once for an
  // unknown worker or an argument that cannot be sent, Error(Shutdown) after shutdown.
  FuturePtr call_async(const std::string& to, const std::string& function,
                       std::vector<c10::IValue> args,
                       std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  c10::IValue call_sync(const std::string& to, const std::string& function,
                        std::vector<c10::IValue> args,
                        std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  // Runs `function` on worker `to`, which keeps the result: the caller gets an RRef at once,
  // before the value exists (torch.distributed.rpc.remote). Errors of the function surface from
  // to_here() and ready(); an unknown worker or unsendable argument throws at once.
  RRefPtr remote(const std::string& to, const std::string& function, std::vector<c10::IValue> args,
                 std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  // Values this worker owns that some RRef, here or elsewhere, still holds.
  std::size_t owned_rref_count() const;

  // Graceful: waits for this agent's outstanding calls, then for every live agent to reach
  // shutdown (serving their calls meanwhile), all within Options::shutdown_timeout. Idempotent.
  void shutdown(bool graceful = true);
  // Bytes of every request and reply this agent has sent, frame headers included (RRef
  // bookkeeping travels as calls and counts too; the rendezvous does not).
  std::uint64_t bytes_sent() const;
  // Bytes read from peers' connections: their requests and replies, hellos included.
  std::uint64_t bytes_received() const;
  // Peers whose connection dropped while the world ran, by name: gone for this world, as calls
  // to them fail at once.
  std::vector<std::string> lost_workers() const;
  // Serves until any agent begins shutdown (then joins it) or the master is gone (then stops at
  // once). What a worker process does with its life.
  void wait_for_shutdown();
  bool running() const;

  struct State;

 private:
  explicit Agent(std::shared_ptr<State> state);
  // Shared only so that callbacks of handler futures, which may fire after the agent is gone,
  // can hold it weakly; the Agent is its one owner.
  std::shared_ptr<State> state_;
};

}  // namespace ferry::rpc
