// What the rendezvous store holds, and the operations on it that rank 0's store server performs
// for its clients (resource type, one per server), with the meaning c10d::Store gives them:
// `add` keeps its counter as decimal text, `get` and `wait` wait for their keys to exist.
//
// Thread rules: apply() from any thread, one call per connection at a time; a Get or a Wait
// blocks its caller until its keys exist, its timeout passes or close() is called.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "rpc/store_protocol.h"

namespace ferry::rpc::store {

class StoreTable {
 public:
  Reply apply(const Request& request);
  // Every call waiting now or later fails at once: the server is going away.
  void close();
  // The calls waiting for keys now.
  std::size_t waiting();

 private:
  Reply add(const Request& request);
  Reply compare_set(const Request& request);
  Reply await_keys(const Request& request);
  bool has_all(const std::vector<std::string>& keys) const;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
  bool closed_ = false;
  std::size_t waiting_ = 0;
};

}  // namespace ferry::rpc::store
