// The one exception type of the rpc layer. Thrown across the API and carried through futures.
#pragma once

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

namespace ferry::rpc {

enum class ErrorKind : std::uint8_t {
  Init = 0,             // rendezvous failed: master unreachable, world incomplete, name clash
  Timeout = 1,          // a call passed its deadline
  PeerDied = 2,         // the connection to the callee dropped while the call was pending
  UnknownFunction = 3,  // the callee has no function of that name
  RemoteException = 4,  // the function itself threw on the callee
  BadFrame = 5,         // bytes on the wire failed validation
  InvalidArgument = 6,  // the caller passed something that cannot be sent or converted
  Shutdown = 7,         // the agent is shutting down or not running
};

const char* to_string(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message, std::string cause = "")
      : std::runtime_error(message), kind_(kind), cause_(std::move(cause)) {}
  ErrorKind kind() const { return kind_; }
  // For an error raised on another worker: its own message, without the call's description.
  const std::string& cause() const { return cause_; }

 private:
  ErrorKind kind_;
  std::string cause_;
};

// Rethrows `error` (a failed future's, a caught exception's) as an Error saying
// "<what>: <reason>": the same kind, RemoteException for anything that is not an Error, and the
// same cause. The reason is the worker's own words when it raised the error there, else the
// whole message. So a lost worker stays PeerDied, whatever was being done with it.
[[noreturn]] void rethrow_as(std::exception_ptr error, const std::string& what);

}  // namespace ferry::rpc
