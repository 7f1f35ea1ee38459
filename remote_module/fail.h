// How remote_module refuses what it is given (a config, routes, a checkpoint file): one
// rpc::Error(InvalidArgument) with `message`, which names what was wrong. Internal to
// remote_module.
#pragma once

#include <string>

#include "ferry/rpc/error.h"

namespace ferry::remote_module {

[[noreturn]] inline void fail(const std::string& message) {
  throw rpc::Error(rpc::ErrorKind::InvalidArgument, message);
}

}  // namespace ferry::remote_module
