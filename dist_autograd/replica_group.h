// The copies of one part of a model that data parallelism keeps identical: one process per copy,
// joined in a Gloo process group (c10d::ProcessGroupGloo) over the world's rendezvous store, so
// that each step's gradients are averaged across the copies before the optimizer uses them.
//
// Thread rules: a group is used by one thread at a time; every member must make the same calls,
// with tensors of the same shapes, in the same order.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace ferry::dist_autograd {

class ReplicaGroup {
 public:
  // Joins group `key` (unique in the world) as member `rank` of `size`; returns when all have
  // joined. Throws rpc::Error(Timeout) naming the group if they have not within the RPC timeout.
  ReplicaGroup(const std::string& key, int rank, int size);
  ~ReplicaGroup();
  ReplicaGroup(const ReplicaGroup&) = delete;
  ReplicaGroup& operator=(const ReplicaGroup&) = delete;

  // Replaces each tensor by its mean over the members, in one all-reduce of them all. Throws
  // rpc::Error naming the group when a member is gone or silent past the RPC timeout.
  void average(std::vector<at::Tensor>& tensors);

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::string key_;
  int rank_, size_;
};

}  // namespace ferry::dist_autograd
