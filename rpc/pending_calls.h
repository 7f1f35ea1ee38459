// The calls an agent waits on, with their deadlines, and the peers it has lost: shared by the
// threads that send calls, the loop thread that answers and expires them, and shutdown.
// Thread-safe. Futures are never completed under its lock: every method that ends calls hands
// them back for the caller to complete or fail.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "ferry/rpc/registry.h"

namespace ferry::rpc {

// A call waiting for its answer. Value type.
struct PendingCall {
  using Clock = std::chrono::steady_clock;
  FuturePtr future;
  int to_rank = -1;
  std::string function;
  Clock::time_point start;
  Clock::time_point deadline;
  std::uint64_t connection_id = 0;  // the connection carrying it; 0 until one does
  // call_sync's future has no callbacks, so it may complete on the loop thread and save a
  // thread hop; call_async's futures complete on the pool so user callbacks never block the loop.
  bool complete_inline = false;
};

class PendingCalls {
 public:
  using Clock = PendingCall::Clock;

  void add(std::uint64_t id, PendingCall call);
  // The call `id`, taken out (answered); nullopt if it is gone (expired, failed, cancelled).
  std::optional<PendingCall> take(std::uint64_t id);
  // Records that `connection_id` carries call `id`; false if the call is gone.
  bool assign(std::uint64_t id, std::uint64_t connection_id);
  // The calls whose deadline is at or before `now`, taken out.
  std::vector<PendingCall> take_expired(Clock::time_point now);
  // The calls `connection_id` carries, taken out (the connection closed).
  std::vector<PendingCall> take_on_connection(std::uint64_t connection_id);
  // Every call, taken out (shutdown).
  std::vector<PendingCall> take_all();
  // Waits until no call is pending or `deadline`; returns how many are left.
  std::size_t wait_until_empty(Clock::time_point deadline);
  // The threads in wait_until_empty now, so that a test knows one is waiting before it answers.
  std::size_t waiting_until_empty() const;
  std::size_t size() const;

  // A peer whose connection dropped is lost for this world: why, kept as first said.
  void mark_lost(int rank, const std::string& reason);
  std::optional<std::string> lost_reason(int rank) const;
  std::set<int> lost_ranks() const;

 private:
  // Under mutex_: call `id` moved out of the table, if it is there.
  std::optional<PendingCall> take_locked(std::uint64_t id);
  std::vector<PendingCall> take_where(const std::function<bool(const PendingCall&)>& wanted);

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::size_t waiting_until_empty_ = 0;  // under mutex_
  std::unordered_map<std::uint64_t, PendingCall> calls_;
  std::set<std::pair<Clock::time_point, std::uint64_t>> deadlines_;
  std::map<int, std::string> lost_;
};

}  // namespace ferry::rpc
