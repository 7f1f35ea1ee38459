// See rref_context.h. Handles are created on user, pool and loop threads; the mutex guards the
// table and is never held while a handle is dropped (dropping one re-enters release()).
#include "rpc/rref_context.h"

#include <fmt/format.h>

#include "ferry/core/log.h"
#include "ferry/rpc/error.h"

namespace ferry::rpc {
namespace {

GlobalId id_from(const std::vector<c10::IValue>& args, size_t at) {
  return GlobalId{static_cast<int>(args.at(at).toInt()),
                  static_cast<std::uint64_t>(args.at(at + 1).toInt())};
}

c10::IValue rank_of(const GlobalId& id) { return static_cast<int64_t>(id.rank); }
c10::IValue local_of(const GlobalId& id) { return static_cast<int64_t>(id.local); }

}  // namespace

RRefContext::RRefContext(int self_rank, NameFn names, CallFn call, InvokeFn invoke, DropFn drop)
    : self_rank_(self_rank),
      names_(std::move(names)),
      call_(std::move(call)),
      invoke_(std::move(invoke)),
      drop_(std::move(drop)) {}

GlobalId RRefContext::next_id() {
  std::lock_guard<std::mutex> lock(mutex_);
  return GlobalId{self_rank_, ++counter_};
}

RRefContext::Owned& RRefContext::owned(const GlobalId& id) {
  Owned& entry = owned_[id];
  if (!entry.value) entry.value = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  return entry;
}

void RRefContext::add_fork(const GlobalId& id, const GlobalId& fork) {
  Owned& entry = owned(id);
  if (entry.deleted.erase(fork) == 0) entry.forks.insert(fork);
}

void RRefContext::remove_fork(const GlobalId& id, const GlobalId& fork) {
  Owned& entry = owned(id);
  if (entry.forks.erase(fork) == 0) entry.deleted.insert(fork);
}

FuturePtr RRefContext::collect(const GlobalId& id) {
  auto it = owned_.find(id);
  if (it == owned_.end()) return FuturePtr();
  Owned& entry = it->second;
  if (!entry.created || entry.local_handles != 0 || !entry.forks.empty() ||
      !entry.deleted.empty()) {
    return FuturePtr();
  }
  FuturePtr value = std::move(entry.value);
  owned_.erase(it);
  return value;
}

RRefPtr RRefContext::make_handle(int owner, bool is_owner, GlobalId id, GlobalId fork) {
  return c10::make_intrusive<RRef>(RRef::Key(), weak_from_this(), owner, is_owner, id, fork);
}

void RRefContext::register_functions(FunctionRegistry& internal) {
  std::weak_ptr<RRefContext> weak = weak_from_this();
  auto self = [weak]() {
    auto context = weak.lock();
    if (!context) throw Error(ErrorKind::Shutdown, "the agent has shut down");
    return context;
  };
  // (function, id rank, id local, fork rank, fork local, arguments): make the value here.
  internal.add_raw("ferry.rref.create", [self](std::vector<c10::IValue>& args) {
    auto context = self();
    GlobalId id = id_from(args, 1), fork = id_from(args, 3);
    FuturePtr value;
    {
      std::lock_guard<std::mutex> lock(context->mutex_);
      Owned& entry = context->owned(id);
      entry.created = true;
      context->add_fork(id, fork);
      value = entry.value;
      context->collect(id);
    }
    std::vector<c10::IValue> call_args = args.at(5).toTupleRef().elements().vec();
    context->invoke_(args.at(0).toStringRef(), std::move(call_args), value);
    return c10::IValue();
  });
  internal.add_async("ferry.rref.fetch", [self](std::vector<c10::IValue>& args) {
    auto context = self();
    std::lock_guard<std::mutex> lock(context->mutex_);
    return context->owned(id_from(args, 0)).value;
  });
  internal.add_async("ferry.rref.ready", [self](std::vector<c10::IValue>& args) {
    auto context = self();
    FuturePtr value;
    {
      std::lock_guard<std::mutex> lock(context->mutex_);
      value = context->owned(id_from(args, 0)).value;
    }
    return value->then(
        [](c10::ivalue::Future& f) {
          f.value();  // rethrows the error of making the value
          return c10::IValue();
        },
        c10::NoneType::get());
  });
  // Forks and deletes only touch the table under its lock: inline, on the loop thread.
  internal.add_inline("ferry.rref.add_fork", [self](std::vector<c10::IValue>& args) {
    auto context = self();
    FuturePtr dropped;
    {
      std::lock_guard<std::mutex> lock(context->mutex_);
      context->add_fork(id_from(args, 0), id_from(args, 2));
      dropped = context->collect(id_from(args, 0));
    }
    if (dropped) context->drop_(std::move(dropped));
    return c10::IValue();
  });
  internal.add_inline("ferry.rref.delete", [self](std::vector<c10::IValue>& args) {
    auto context = self();
    FuturePtr dropped;
    {
      std::lock_guard<std::mutex> lock(context->mutex_);
      context->remove_fork(id_from(args, 0), id_from(args, 2));
      dropped = context->collect(id_from(args, 0));
    }
    if (dropped) context->drop_(std::move(dropped));
    return c10::IValue();
  });
}

RRefPtr RRefContext::remote(int to_rank, const std::string& function, std::vector<c10::IValue> args,
                            std::optional<std::chrono::milliseconds> timeout) {
  GlobalId id = next_id();
  if (to_rank == self_rank_) {
    FuturePtr value;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Owned& entry = owned(id);
      entry.created = true;
      entry.local_handles++;
      value = entry.value;
    }
    RRefPtr handle = make_handle(self_rank_, true, id, id);
    invoke_(function, std::move(args), value);
    return handle;
  }
  // The creator's own fork has the id of the value, as in PyTorch.
  RRefPtr handle = make_handle(to_rank, false, id, id);
  FuturePtr ack;
  try {
    ack = call_(to_rank, "ferry.rref.create",
                {function, rank_of(id), local_of(id), rank_of(id), local_of(id),
                 c10::ivalue::Tuple::create(std::move(args))},
                timeout);
  } catch (...) {
    handle->announced_ = false;
    throw;
  }
  // The callback holds the handle: the fork stays registered at least until the owner confirms.
  ack->addCallback([handle](c10::ivalue::Future& done) {
    if (!done.hasError()) handle->confirmed_ = true;
  });
  return handle;
}

RRefWire RRefContext::fork_for_send(const c10::intrusive_ptr<c10::RRefInterface>& rref, int) {
  auto* raw = dynamic_cast<RRef*>(rref.get());
  if (raw == nullptr) {
    throw Error(ErrorKind::InvalidArgument, "only RRefs made by Ferry can be sent");
  }
  RRefPtr handle = RRefPtr::reclaim_copy(raw);
  GlobalId fork = next_id();
  RRefWire wire{handle->owner_, handle->id_.rank, handle->id_.local, fork.rank, fork.local};
  if (handle->is_owner_) {
    std::lock_guard<std::mutex> lock(mutex_);
    add_fork(handle->id_, fork);
    return wire;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    awaiting_confirmation_[fork] = handle;
  }
  std::weak_ptr<RRefContext> weak = weak_from_this();
  auto confirmed = [weak, fork] {
    auto context = weak.lock();
    if (!context) return;
    RRefPtr held;  // dropped after the lock is released: dropping may re-enter release()
    std::lock_guard<std::mutex> lock(context->mutex_);
    auto it = context->awaiting_confirmation_.find(fork);
    if (it == context->awaiting_confirmation_.end()) return;
    held = std::move(it->second);
    context->awaiting_confirmation_.erase(it);
  };
  try {
    FuturePtr ack = call_(
        handle->owner_, "ferry.rref.add_fork",
        {rank_of(handle->id_), local_of(handle->id_), rank_of(fork), local_of(fork)}, std::nullopt);
    ack->addCallback([confirmed](c10::ivalue::Future&) { confirmed(); });
  } catch (...) {
    confirmed();
    throw;
  }
  return wire;
}

c10::IValue RRefContext::receive(const RRefWire& wire) {
  GlobalId id{wire.id_rank, wire.id_local};
  GlobalId fork{wire.fork_rank, wire.fork_local};
  if (wire.owner == self_rank_) {
    // Our own value came back: a local handle replaces the fork the sender made for us.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      owned(id).local_handles++;
      remove_fork(id, fork);
    }
    return to_ivalue(make_handle(self_rank_, true, id, fork));
  }
  if (wire.owner < 0) {
    throw Error(ErrorKind::BadFrame,
                fmt::format("RRef {} names owner rank {}", id.str(), wire.owner));
  }
  RRefPtr handle = make_handle(wire.owner, false, id, fork);
  handle->confirmed_ = true;  // its sender registered this fork with the owner
  return to_ivalue(handle);
}

void RRefContext::release(const RRef& rref) {
  if (rref.is_owner_) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = owned_.find(rref.id_);
    if (it == owned_.end()) return;
    it->second.local_handles--;
    collect(rref.id_);
    return;
  }
  if (!rref.announced_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return;
  }
  try {
    call_(rref.owner_, "ferry.rref.delete",
          {rank_of(rref.id_), local_of(rref.id_), rank_of(rref.fork_), local_of(rref.fork_)},
          std::nullopt);
  } catch (const std::exception& e) {
    log::debug("could not tell {} that RRef {} was dropped: {}", name_of(rref.owner_),
               rref.id_.str(), e.what());
  }
}

c10::IValue RRefContext::fetch(const RRef& rref, std::optional<std::chrono::milliseconds> timeout) {
  FuturePtr value;
  if (rref.is_owner_) {
    std::lock_guard<std::mutex> lock(mutex_);
    value = owned(rref.id_).value;
  } else {
    value =
        call_(rref.owner_, "ferry.rref.fetch", {rank_of(rref.id_), local_of(rref.id_)}, timeout);
  }
  value->wait();
  return value->value();
}

FuturePtr RRefContext::ready(const RRef& rref) {
  if (rref.is_owner_) {
    std::lock_guard<std::mutex> lock(mutex_);
    return owned(rref.id_).value->then(
        [](c10::ivalue::Future& f) {
          f.value();  // rethrows the error of making the value
          return c10::IValue();
        },
        c10::NoneType::get());
  }
  // The owner answers only once the value exists, and so after it registered this user: the
  // answer confirms the user before ready() completes, whichever of the create and ready replies
  // runs its callbacks first.
  RRefPtr handle = RRefPtr::reclaim_copy(const_cast<RRef*>(&rref));
  return call_(rref.owner_, "ferry.rref.ready", {rank_of(rref.id_), local_of(rref.id_)},
               std::nullopt)
      ->then(
          [handle](c10::ivalue::Future& f) {
            f.value();
            handle->confirmed_ = true;
            return c10::IValue();
          },
          c10::NoneType::get());
}

c10::IValue RRefContext::local_value(const RRef& rref) {
  if (!rref.is_owner_) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("local_value() of RRef {} called on a user; its owner is \"{}\"",
                            rref.id_.str(), name_of(rref.owner_)));
  }
  FuturePtr value;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    value = owned(rref.id_).value;
  }
  if (!value->completed()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("the value of RRef {} is not ready yet", rref.id_.str()));
  }
  return value->value();
}

std::size_t RRefContext::owned_count() {
  std::lock_guard<std::mutex> lock(mutex_);
  return owned_.size();
}

void RRefContext::stop() {
  std::map<GlobalId, RRefPtr> awaiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
    awaiting.swap(awaiting_confirmation_);
  }
}

}  // namespace ferry::rpc
