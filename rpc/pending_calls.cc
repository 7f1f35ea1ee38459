#include "rpc/pending_calls.h"

namespace ferry::rpc {

void PendingCalls::add(std::uint64_t id, PendingCall call) {
  std::lock_guard<std::mutex> lock(mutex_);
  deadlines_.emplace(call.deadline, id);
  calls_.emplace(id, std::move(call));
}

std::optional<PendingCall> PendingCalls::take(std::uint64_t id) {
  std::vector<PendingCall> taken = take_if({id});
  if (taken.empty()) return std::nullopt;
  return std::move(taken.front());
}

bool PendingCalls::assign(std::uint64_t id, std::uint64_t connection_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return false;
  it->second.connection_id = connection_id;
  return true;
}

std::vector<PendingCall> PendingCalls::take_expired(Clock::time_point now) {
  std::vector<std::uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = deadlines_.begin(); it != deadlines_.end() && it->first <= now; ++it) {
      ids.push_back(it->second);
    }
  }
  return take_if(ids);
}

std::vector<PendingCall> PendingCalls::take_on_connection(std::uint64_t connection_id) {
  std::vector<std::uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [id, call] : calls_) {
      if (call.connection_id == connection_id) ids.push_back(id);
    }
  }
  return take_if(ids);
}

std::vector<PendingCall> PendingCalls::take_all() {
  std::vector<std::uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [id, call] : calls_) ids.push_back(id);
  }
  return take_if(ids);
}

// Another thread may take some of `ids` between the listing and this: those are skipped, so
// each call is taken exactly once.
std::vector<PendingCall> PendingCalls::take_if(const std::vector<std::uint64_t>& ids) {
  std::vector<PendingCall> taken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::uint64_t id : ids) {
      auto it = calls_.find(id);
      if (it == calls_.end()) continue;
      deadlines_.erase({it->second.deadline, id});
      taken.push_back(std::move(it->second));
      calls_.erase(it);
    }
  }
  if (!taken.empty()) changed_.notify_all();
  return taken;
}

std::size_t PendingCalls::wait_until_empty(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_until(lock, deadline, [this] { return calls_.empty(); });
  return calls_.size();
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
