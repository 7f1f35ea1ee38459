// How the trainer refuses what it is given (a flag's value, settings that cannot work together, a
// file that is not what it should be): one rpc::Error(InvalidArgument) whose message names what
// was wrong, the flag or the file. The trainer throws no other type of its own.
#pragma once

#include <string>

#include "ferry/rpc/error.h"

namespace ferry::trainer {

[[noreturn]] inline void fail(const std::string& message) {
  throw rpc::Error(rpc::ErrorKind::InvalidArgument, message);
}

}  // namespace ferry::trainer
