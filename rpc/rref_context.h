// The bookkeeping behind RRefs of one agent: the values this worker owns with the forks of each,
// the forks this worker sent and awaits confirmation for, and the internal functions through
// which workers tell each other about forks. Resource type, owned by the agent.
//
// Thread rules: every method may be called from any thread; the table has its own mutex.
// receive() runs on the loop thread while a frame is decoded, so it never blocks.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ferry/rpc/registry.h"
#include "ferry/rpc/rref.h"
#include "rpc/frame.h"

namespace ferry::rpc {

class RRefContext : public RRefCodec, public std::enable_shared_from_this<RRefContext> {
 public:
  // Sends a call from this agent; any thread.
  using CallFn = std::function<FuturePtr(int to_rank, const std::string& function,
                                         std::vector<c10::IValue> args,
                                         std::optional<std::chrono::milliseconds> timeout)>;
  // Runs a user function of this agent on its pool, completing `into` with its result or error.
  using InvokeFn = std::function<void(const std::string& function, std::vector<c10::IValue> args,
                                      FuturePtr into)>;

  // The worker name of a rank (known once the world has joined).
  using NameFn = std::function<std::string(int rank)>;
  // Lets go of a value nobody refers to any more, on a thread where freeing it may take long:
  // forks and deletes are served on the loop thread.
  using DropFn = std::function<void(FuturePtr value)>;

  RRefContext(int self_rank, NameFn names, CallFn call, InvokeFn invoke, DropFn drop);

  // The agent's internal functions ("ferry.rref.*") that owners serve.
  void register_functions(FunctionRegistry& internal);

  RRefPtr remote(int to_rank, const std::string& function, std::vector<c10::IValue> args,
                 std::optional<std::chrono::milliseconds> timeout);

  RRefWire fork_for_send(const c10::intrusive_ptr<c10::RRefInterface>& rref, int to_rank) override;
  c10::IValue receive(const RRefWire& wire) override;

  // Values this worker owns and still keeps.
  std::size_t owned_count();
  // Called when the agent stops: the context's sends fail from now on.
  void stop();

  // ---- used by RRef -----------------------------------------------------------------------
  std::string name_of(int rank) const { return names_(rank); }
  c10::IValue fetch(const RRef& rref, std::optional<std::chrono::milliseconds> timeout);
  FuturePtr ready(const RRef& rref);
  c10::IValue local_value(const RRef& rref);
  void release(const RRef& rref);

 private:
  struct Owned {
    FuturePtr value;
    bool created = false;        // the remote() that makes it has arrived
    int local_handles = 0;       // owner-side RRef objects alive
    std::set<GlobalId> forks;    // forks alive elsewhere
    std::set<GlobalId> deleted;  // forks deleted before their registration arrived
  };

  GlobalId next_id();
  Owned& owned(const GlobalId& id);  // mutex held; creates the entry on first mention
  void add_fork(const GlobalId& id, const GlobalId& fork);     // mutex held
  void remove_fork(const GlobalId& id, const GlobalId& fork);  // mutex held
  // Mutex held. Forgets the value once no reference to it is left, and returns it then.
  FuturePtr collect(const GlobalId& id);
  RRefPtr make_handle(int owner, bool is_owner, GlobalId id, GlobalId fork);

  const int self_rank_;
  const NameFn names_;
  const CallFn call_;
  const InvokeFn invoke_;
  const DropFn drop_;
  std::mutex mutex_;
  std::uint64_t counter_ = 0;
  bool stopped_ = false;
  std::map<GlobalId, Owned> owned_;
  std::map<GlobalId, RRefPtr> awaiting_confirmation_;  // keyed by the fork sent
};

}  // namespace ferry::rpc
