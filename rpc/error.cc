#include "ferry/rpc/error.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>

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
  }
  return "Unknown";
}

void rethrow_as(std::exception_ptr error, const std::string& what) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    throw Error(e.kind(), fmt::format("{}: {}", what, e.cause().empty() ? e.what() : e.cause()),
                e.cause());
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::RemoteException,
                fmt::format("{}: {}", what, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw Error(ErrorKind::RemoteException, fmt::format("{}: {}", what, e.what()));
  } catch (...) {
    throw Error(ErrorKind::RemoteException, fmt::format("{}: unknown exception", what));
  }
}

}  // namespace ferry::rpc
