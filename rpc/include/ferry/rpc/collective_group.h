// A few processes joined in a Gloo process group (c10d::ProcessGroupGloo) over the world's
// rendezvous store, for collectives between them: the copies of one part of a model that data
// parallelism keeps identical average their gradients, or sum a layer's batch statistics.
//
// Thread rules: a group is used by one thread at a time; every member must make the same calls,
// with tensors of the same shapes, in the same order.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace ferry::rpc {

class CollectiveGroup {
 public:
  // Joins group `key` (unique in the world) as member `rank` of `size`; returns when all have
  // joined. Throws Error(Timeout) naming the group if they have not within the RPC timeout.
  CollectiveGroup(const std::string& key, int rank, int size);
  ~CollectiveGroup();
  CollectiveGroup(const CollectiveGroup&) = delete;
  CollectiveGroup& operator=(const CollectiveGroup&) = delete;

  // Replaces each tensor by its sum over the members, in one all-reduce of them all. Throws
  // Error naming the group when a member is gone or silent past the RPC timeout.
  void sum(std::vector<at::Tensor>& tensors);
  // The same, divided by the number of members.
  void average(std::vector<at::Tensor>& tensors);

  const std::string& key() const { return key_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::string key_;
  int rank_, size_;
};

}  // namespace ferry::rpc
