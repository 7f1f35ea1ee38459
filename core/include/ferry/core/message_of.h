// What an exception says to a user.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace ferry::core {

// Its message; LibTorch's errors without the C++ backtrace they carry.
inline std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

}  // namespace ferry::core
