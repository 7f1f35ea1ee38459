// A few processes joined in a c10d process group over the world's rendezvous store (Gloo's, or
// NCCL's for CUDA tensors where LibTorch has it), for collectives between them: the copies of one
// part of a model that data parallelism keeps identical average their gradients (in buckets,
// start_sum), or sum a layer's batch statistics.
//
// Thread rules: a group is used by one thread at a time (its all-reduces run on its own thread);
// every member must make the same calls, with tensors of the same shapes, in the same order.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>

#include <memory>
#include <string>
#include <vector>

namespace ferry::rpc {

// An all-reduce under way (CollectiveGroup::start_sum). Resource type; wait() once, from one
// thread.
class PendingSum {
 public:
  PendingSum(PendingSum&&) noexcept;
  PendingSum& operator=(PendingSum&&) noexcept;
  ~PendingSum();
  // Returns once the sum is in the tensor given to start_sum; throws Error naming the group when
  // a member is gone or silent past the RPC timeout.
  void wait();

 private:
  friend class CollectiveGroup;
  struct State;
  explicit PendingSum(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

enum class CollectiveBackend { Gloo, Nccl };

// "gloo" or "nccl".
const char* to_string(CollectiveBackend backend);

// Whether this build's LibTorch has c10d's NCCL process group (a CUDA LibTorch built with NCCL).
bool nccl_built();

// The backend for a group whose tensors live on devices of `type`: NCCL for CUDA tensors where
// `nccl` (nccl_built()), Gloo for everything else (Gloo also sums CUDA tensors, through the
// host). Every member of a group must hold its tensors on the same kind of device.
CollectiveBackend collective_backend_for(c10::DeviceType type, bool nccl);

class CollectiveGroup {
 public:
  // Joins group `key` (unique in the world) as member `rank` of `size`, through `backend`;
  // returns when all have joined. Throws Error(Timeout) naming the group if they have not within
  // the RPC timeout, Error(InvalidArgument) for NCCL where nccl_built() is false.
  CollectiveGroup(const std::string& key, int rank, int size,
                  CollectiveBackend backend = CollectiveBackend::Gloo);
  ~CollectiveGroup();
  CollectiveGroup(const CollectiveGroup&) = delete;
  CollectiveGroup& operator=(const CollectiveGroup&) = delete;

  // Replaces each tensor by its sum over the members, in one all-reduce of them all. Throws
  // Error naming the group when a member is gone or silent past the RPC timeout.
  void sum(std::vector<at::Tensor>& tensors);
  // Starts summing contiguous `flat` over the members, in place, and returns at once: the group
  // runs its collectives one after another on a thread of its own, in the order they were
  // started, so a caller may compute meanwhile. `flat` must stay untouched until wait() returns.
  PendingSum start_sum(const at::Tensor& flat);

  const std::string& key() const { return key_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // "collective group "KEY" (member R of N)", for messages.
  std::string describe() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::string key_;
  int rank_, size_;
};

}  // namespace ferry::rpc
