// Remote references (mirrors torch.distributed.rpc.RRef). A value made by remote() stays on the
// worker that made it, its owner; everyone else holds an RRef to it, which can travel inside
// arguments and results like any value. The owner frees the value once no RRef to it is left
// anywhere in the world.
//
// Reference counting follows PyTorch's owner/user scheme: every copy of a reference outside the
// owner is a fork with its own id, registered with the owner. Whoever sends an RRef forks it:
// the owner registers the fork at once; a user asks the owner to register it and keeps its own
// fork alive until the owner confirms, so the owner's count cannot reach zero while a fork is in
// flight. A dropped fork tells the owner; a deletion that overtakes its registration is
// remembered until the registration arrives.
//
// Thread rules: every method may be called from any thread except the agent's loop thread
// (to_here and ready().wait() block).
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace ferry::rpc {

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;
class RRefContext;

// A cluster-unique id: the rank that made it and a counter there.
struct GlobalId {
  int rank = -1;
  std::uint64_t local = 0;
  bool operator<(const GlobalId& o) const {
    return rank != o.rank ? rank < o.rank : local < o.local;
  }
  bool operator==(const GlobalId& o) const { return rank == o.rank && local == o.local; }
  std::string str() const;
};

class RRef final : public c10::RRefInterface {
 public:
  // Only RRefContext makes RRefs (the key's constructor is private to it).
  class Key {
    friend class RRefContext;
    Key() = default;
  };
  RRef(Key, std::weak_ptr<RRefContext> context, int owner, bool is_owner, GlobalId id,
       GlobalId fork);
  ~RRef() override;

  c10::worker_id_t owner() const override { return static_cast<c10::worker_id_t>(owner_); }
  std::string ownerName() const override;
  bool isOwner() const override { return is_owner_; }
  bool confirmedByOwner() const override { return is_owner_ || confirmed_.load(); }
  const c10::TypePtr type() const override { return c10::AnyType::get(); }

  const GlobalId& id() const { return id_; }
  const GlobalId& fork_id() const { return fork_; }

  // A copy of the value. On the owner it waits for the value; elsewhere it asks the owner.
  // Throws the error that making the value raised, or the call's error (a dead owner is named).
  c10::IValue to_here(std::optional<std::chrono::milliseconds> timeout = std::nullopt) const;
  // Completes (with None) once the value exists on the owner, or with the error making it raised.
  FuturePtr ready() const;
  // The owner's value itself, no copy. Throws Error(InvalidArgument) on a user or before the
  // value is ready.
  c10::IValue local_value() const;

 private:
  friend class RRefContext;

  std::weak_ptr<RRefContext> context_;
  int owner_;
  bool is_owner_;
  GlobalId id_;
  GlobalId fork_;
  std::atomic<bool> confirmed_{false};
  // False for a reference the owner never heard of (its remote() could not be sent): dropping
  // it must not tell the owner anything.
  std::atomic<bool> announced_{true};
};

using RRefPtr = c10::intrusive_ptr<RRef>;

// The RRef inside `value`; throws Error(InvalidArgument) if it holds none.
RRefPtr to_rref(const c10::IValue& value);
// `rref` as a value that can be sent or returned (the inverse of to_rref).
c10::IValue to_ivalue(const RRefPtr& rref);

}  // namespace ferry::rpc
