// How a layer refuses what it is given (a depth, a block range, a split's plan, a data folder):
// one std::invalid_argument with `message`, which names what was wrong and where; a stage's caller
// gets it as rpc::ErrorKind::InvalidArgument.
#pragma once

#include <stdexcept>
#include <string>

namespace ferry::core {

[[noreturn]] inline void fail(const std::string& message) { throw std::invalid_argument(message); }

}  // namespace ferry::core
