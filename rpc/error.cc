#include "ferry/rpc/error.h"

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

}  // namespace ferry::rpc
