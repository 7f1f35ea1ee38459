// The message of what `f` throws, for tests that check an error names what was wrong.
#pragma once

#include <exception>
#include <functional>
#include <string>

#include "ferry/rpc/error.h"
#include "ferry/rpc/registry.h"

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

// As error_of, with the kind first: "PeerDied: ..." for an rpc::Error, "other: ..." for any
// other exception.
inline std::string kind_and_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const rpc::Error& e) {
    return std::string(rpc::to_string(e.kind())) + ": " + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "no error";
}

// What a call's future fails with, as kind_and_error_of says it; waits for it first.
inline std::string kind_and_error_of(const rpc::FuturePtr& future) {
  future->wait();
  if (!future->hasError()) return "no error";
  return kind_and_error_of([&] { std::rethrow_exception(future->exception_ptr()); });
}

// The worker a call's rpc::Error concerns (Error::worker); "no error" or "not an rpc::Error"
// otherwise. Waits for the future first.
inline std::string worker_of(const rpc::FuturePtr& future) {
  future->wait();
  if (!future->hasError()) return "no error";
  try {
    std::rethrow_exception(future->exception_ptr());
  } catch (const rpc::Error& e) {
    return e.worker();
  } catch (...) {
  }
  return "not an rpc::Error";
}

}  // namespace ferry::testing
