// The message of what `f` throws, for tests that check an error names what was wrong.
#pragma once

#include <exception>
#include <functional>
#include <string>

namespace ferry::testing {

// "no error" when `f` returns normally, so that a test expecting a message fails visibly.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace ferry::testing
