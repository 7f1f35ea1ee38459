#include "ferry/rpc/error.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include "ferry/core/message_of.h"

namespace ferry::rpc {

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::Init:
      return "Init";
    case ErrorKind::Timeout:
      return "Timeout";
    case ErrorKind::PeerDied:
      return "PeerDied";
    case ErrorKind::UnknownFunction:
      return "UnknownFunction";
    case ErrorKind::RemoteException:
      return "RemoteException";
    case ErrorKind::BadFrame:
      return "BadFrame";
    case ErrorKind::InvalidArgument:
      return "InvalidArgument";
    case ErrorKind::Shutdown:
      return "Shutdown";
    case ErrorKind::OutOfMemory:
      return "OutOfMemory";
  }
  return "Unknown";
}

void refuse(const std::string& message) { throw Error(ErrorKind::InvalidArgument, message); }

bool is_lost(ErrorKind kind) { return kind == ErrorKind::PeerDied || kind == ErrorKind::Timeout; }

bool is_lost(const Error& e) { return is_lost(e.kind()); }

Failure failure_of(std::exception_ptr error) {
  Failure failure;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    failure = {e.kind(), e.what(), e.cause(), e.worker()};
  } catch (const c10::OutOfMemoryError& e) {
    failure.kind = ErrorKind::OutOfMemory;
    failure.message = core::message_of(e);
  } catch (const std::invalid_argument& e) {
    failure.kind = ErrorKind::InvalidArgument;
    failure.message = e.what();
  } catch (const std::exception& e) {
    failure.message = core::message_of(e);
  } catch (...) {
    failure.message = "unknown exception";
  }
  return failure;
}

std::exception_ptr first_failure(const std::vector<std::exception_ptr>& failures) {
  std::exception_ptr first;
  for (const std::exception_ptr& failure : failures) {
    if (!failure) continue;
    if (is_lost(failure_of(failure).kind)) return failure;
    if (!first) first = failure;
  }
  return first;
}

void rethrow_as(std::exception_ptr error, const std::string& what) {
  Failure failure = failure_of(error);
  throw Error(failure.kind,
              fmt::format("{}: {}", what, failure.cause.empty() ? failure.message : failure.cause),
              failure.cause, failure.worker);
}

}  // namespace ferry::rpc
