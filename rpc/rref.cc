// RRef handles delegate to their agent's RRefContext; see rref.h for the thread rules.
#include "ferry/rpc/rref.h"

#include <fmt/format.h>

#include "ferry/rpc/error.h"
#include "rpc/rref_context.h"

namespace ferry::rpc {
namespace {

std::shared_ptr<RRefContext> context_of(const std::weak_ptr<RRefContext>& weak,
                                        const GlobalId& id) {
  auto context = weak.lock();
  if (!context) {
    throw Error(ErrorKind::Shutdown,
                fmt::format("RRef {} cannot be used: its agent has shut down", id.str()));
  }
  return context;
}

}  // namespace

std::string GlobalId::str() const { return fmt::format("{}:{}", rank, local); }

RRef::RRef(Key, std::weak_ptr<RRefContext> context, int owner, bool is_owner, GlobalId id,
           GlobalId fork)
    : context_(std::move(context)), owner_(owner), is_owner_(is_owner), id_(id), fork_(fork) {}

RRef::~RRef() {
  if (auto context = context_.lock()) context->release(*this);
}

std::string RRef::ownerName() const { return context_of(context_, id_)->name_of(owner_); }

c10::IValue RRef::to_here(std::optional<std::chrono::milliseconds> timeout) const {
  return context_of(context_, id_)->fetch(*this, timeout);
}

FuturePtr RRef::ready() const { return context_of(context_, id_)->ready(*this); }

c10::IValue RRef::local_value() const { return context_of(context_, id_)->local_value(*this); }

c10::IValue to_ivalue(const RRefPtr& rref) {
  return c10::IValue(c10::intrusive_ptr<c10::RRefInterface>(rref));
}

RRefPtr to_rref(const c10::IValue& value) {
  if (value.isRRef()) {
    auto* rref = dynamic_cast<RRef*>(value.toRRef().get());
    if (rref != nullptr) return RRefPtr::reclaim_copy(rref);
  }
  throw Error(ErrorKind::InvalidArgument,
              fmt::format("expected a Ferry RRef but got {}", value.tagKind()));
}

}  // namespace ferry::rpc
