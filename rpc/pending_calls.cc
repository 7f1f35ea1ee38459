#include "rpc/pending_calls.h"

namespace ferry::rpc {

void PendingCalls::add(std::uint64_t id, PendingCall call) {
  std::lock_guard<std::mutex> lock(mutex_);
  deadlines_.emplace(call.deadline, id);
  calls_.emplace(id, std::move(call));
}

std::optional<PendingCall> PendingCalls::take(std::uint64_t id) {
  std::optional<PendingCall> call;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    call = take_locked(id);
  }
  if (call) changed_.notify_all();
  return call;
}

bool PendingCalls::assign(std::uint64_t id, std::uint64_t connection_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return false;
  it->second.connection_id = connection_id;
  return true;
}

std::vector<PendingCall> PendingCalls::take_expired(Clock::time_point now) {
  std::vector<PendingCall> taken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      taken.push_back(*take_locked(deadlines_.begin()->second));
    }
  }
  if (!taken.empty()) changed_.notify_all();
  return taken;
}

std::vector<PendingCall> PendingCalls::take_on_connection(std::uint64_t connection_id) {
  return take_where(
      [connection_id](const PendingCall& c) { return c.connection_id == connection_id; });
}

std::vector<PendingCall> PendingCalls::take_all() {
  return take_where([](const PendingCall&) { return true; });
}

std::optional<PendingCall> PendingCalls::take_locked(std::uint64_t id) {
  auto it = calls_.find(id);
  if (it == calls_.end()) return std::nullopt;
  deadlines_.erase({it->second.deadline, id});
  PendingCall call = std::move(it->second);
  calls_.erase(it);
  return call;
}

std::vector<PendingCall> PendingCalls::take_where(
    const std::function<bool(const PendingCall&)>& wanted) {
  std::vector<PendingCall> taken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = calls_.begin(); it != calls_.end();) {
      if (!wanted(it->second)) {
        ++it;
        continue;
      }
      deadlines_.erase({it->second.deadline, it->first});
      taken.push_back(std::move(it->second));
      it = calls_.erase(it);
    }
  }
  if (!taken.empty()) changed_.notify_all();
  return taken;
}

std::size_t PendingCalls::wait_until_empty(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  ++waiting_until_empty_;
  changed_.wait_until(lock, deadline, [this] { return calls_.empty(); });
  --waiting_until_empty_;
  return calls_.size();
}

std::size_t PendingCalls::waiting_until_empty() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_until_empty_;
}

std::size_t PendingCalls::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_.size();
}

void PendingCalls::mark_lost(int rank, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  lost_.emplace(rank, reason);
}

std::optional<std::string> PendingCalls::lost_reason(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = lost_.find(rank);
  if (it == lost_.end()) return std::nullopt;
  return it->second;
}

std::set<int> PendingCalls::lost_ranks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<int> ranks;
  for (const auto& [rank, reason] : lost_) ranks.insert(rank);
  return ranks;
}

}  // namespace ferry::rpc
