// Reaching the value behind an RRef that this worker owns. Internal to dist_autograd/.
#pragma once

#include <ATen/core/ivalue.h>
#include <fmt/format.h>

#include "ferry/rpc/error.h"
#include "ferry/rpc/rref.h"

namespace ferry::dist_autograd {

// The owner's value itself, waiting until it is made: an RRef can travel, and come back, before
// its value exists (remote_parameters() hands them out at once). Throws if this worker is not
// the owner, since a copy would be updated in vain.
inline c10::IValue owned_value(const c10::IValue& ref, const char* what) {
  rpc::RRefPtr rref = rpc::to_rref(ref);
  if (!rref->isOwner()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("{}: RRef {} is owned by worker \"{}\", not by this one", what,
                                 rref->id().str(), rref->ownerName()));
  }
  return rref->to_here();
}

}  // namespace ferry::dist_autograd
