// How models refuses what it is given (a depth, a block range, a split's plan): one
// std::invalid_argument with `message`, which names what was wrong; a stage's caller gets it as
// rpc::ErrorKind::InvalidArgument. Internal to models.
#pragma once

#include <stdexcept>
#include <string>

namespace ferry::models {

[[noreturn]] inline void fail(const std::string& message) { throw std::invalid_argument(message); }

}  // namespace ferry::models
