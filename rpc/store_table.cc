// Called from the store server's connection threads, one per client.
#include "rpc/store_table.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>

namespace ferry::rpc::store {
namespace {

Reply refused(std::string why) {
  Reply reply;
  reply.ok = false;
  reply.error = std::move(why);
  return reply;
}

}  // namespace

Reply StoreTable::apply(const Request& request) {
  const bool one_key = request.op == Op::Set || request.op == Op::Get || request.op == Op::Add ||
                       request.op == Op::DeleteKey || request.op == Op::CompareSet;
  if (one_key && request.keys.size() != 1) {
    return refused(
        fmt::format("a store request of this kind names one key, not {}", request.keys.size()));
  }
  switch (request.op) {
    case Op::Get:
    case Op::Wait:
      return await_keys(request);
    case Op::Add:
      return add(request);
    case Op::CompareSet:
      return compare_set(request);
    default:
      break;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Reply reply;
  switch (request.op) {
    case Op::Set:
      values_[request.keys[0]] = request.value;
      changed_.notify_all();
      break;
    case Op::Check:
      reply.number = has_all(request.keys) ? 1 : 0;
      break;
    case Op::DeleteKey:
      reply.number = static_cast<std::int64_t>(values_.erase(request.keys[0]));
      break;
    case Op::NumKeys:
      reply.number = static_cast<std::int64_t>(values_.size());
      break;
    default:
      break;
  }
  return reply;
}

void StoreTable::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  changed_.notify_all();
}

Reply StoreTable::add(const Request& request) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string& key = request.keys[0];
  std::int64_t value = 0;
  if (auto it = values_.find(key); it != values_.end()) {
    try {
      std::size_t used = 0;
      value = std::stoll(it->second, &used);
      if (used != it->second.size()) throw std::invalid_argument("trailing bytes");
    } catch (const std::exception&) {
      return refused(fmt::format("store key \"{}\" holds a value that is not a number", key));
    }
  }
  value += request.amount;
  values_[key] = std::to_string(value);
  changed_.notify_all();
  Reply reply;
  reply.number = value;
  return reply;
}

Reply StoreTable::compare_set(const Request& request) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string& key = request.keys[0];
  Reply reply;
  auto it = values_.find(key);
  if (it == values_.end()) {
    // As c10d's stores: a missing key counts as the empty value.
    if (!request.value.empty()) {
      reply.value = request.value;
      return reply;
    }
    values_[key] = request.desired;
    changed_.notify_all();
    reply.value = request.desired;
    return reply;
  }
  if (it->second == request.value) {
    it->second = request.desired;
    changed_.notify_all();
  }
  reply.value = it->second;
  return reply;
}

std::size_t StoreTable::waiting() {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_;
}

Reply StoreTable::await_keys(const Request& request) {
  const auto timeout = std::chrono::milliseconds(std::max<std::int64_t>(request.timeout_ms, 0));
  std::unique_lock<std::mutex> lock(mutex_);
  ++waiting_;
  const bool woken =
      changed_.wait_for(lock, timeout, [&] { return closed_ || has_all(request.keys); });
  --waiting_;
  if (!woken) {
    return refused(fmt::format("waited {} ms for store keys that did not appear: {}",
                               timeout.count(), fmt::join(request.keys, ", ")));
  }
  if (closed_) return refused("the store is closing");
  Reply reply;
  if (request.op == Op::Get) reply.value = values_.at(request.keys[0]);
  return reply;
}

bool StoreTable::has_all(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& key) { return values_.count(key) > 0; });
}

}  // namespace ferry::rpc::store
