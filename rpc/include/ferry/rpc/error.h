// The one exception type of the rpc layer. Thrown across the API and carried through futures.
#pragma once

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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
  // A tensor did not fit: a device's memory, or the process's tensor memory budget
  // (ferry/core/process_memory.h); raised on the worker that ran out.
  OutOfMemory = 8,
};

const char* to_string(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message, std::string cause = "", std::string worker = "")
      : std::runtime_error(message),
        kind_(kind),
        cause_(std::move(cause)),
        worker_(std::move(worker)) {}
  ErrorKind kind() const { return kind_; }
  // For an error raised on another worker: its own message, without the call's description.
  const std::string& cause() const { return cause_; }
  // The worker the error concerns: the one that died (PeerDied), did not answer in time
  // (Timeout), or raised it (any other kind met on another worker). It is kept across hops: when
  // worker "a" fails because its call to "b" did, the caller of "a" gets "b". Empty for an error
  // about no other worker (a bad argument, an agent not running).
  const std::string& worker() const { return worker_; }

  // The same error told as `message` (what a layer above was doing, then why): the kind and the
  // worker stay; the new message is the whole story, so it has no separate cause.
  Error restated(const std::string& message) const { return Error(kind_, message, "", worker_); }

 private:
  ErrorKind kind_;
  std::string cause_;
  std::string worker_;
};

// Throws Error(InvalidArgument, message): how the layers above refuse a value, a setting or a file
// they were given (a flag, a config, routes, a checkpoint), `message` naming it and what was wrong.
[[noreturn]] void refuse(const std::string& message);

// Whether `e` means its worker is gone for the caller: it died (PeerDied) or stopped answering
// (Timeout). A spare may take over such a worker; no other kind of error is a reason to.
bool is_lost(ErrorKind kind);
bool is_lost(const Error& e);

// What any exception says, classed as the wire reports it, for code that passes a failure on.
struct Failure {
  // An Error's own kind; OutOfMemory for c10::OutOfMemoryError (a device's or the budget's);
  // InvalidArgument for std::invalid_argument (bad input, as models and stages report it, so the
  // caller learns it was its input); RemoteException for the rest.
  ErrorKind kind = ErrorKind::RemoteException;
  std::string message;  // LibTorch's errors without their C++ backtrace
  std::string cause;    // an Error's cause(), else empty
  std::string worker;   // an Error's worker(), else empty
};
Failure failure_of(std::exception_ptr error);

// Of several failures (null where nothing failed), the one to report: the first that lost a
// worker, since the caller may put a spare in its place even when another worker failed first
// because of it; else the first. Null if none failed.
std::exception_ptr first_failure(const std::vector<std::exception_ptr>& failures);

// Rethrows `error` (a failed future's, a caught exception's) as an Error saying
// "<what>: <reason>": the kind failure_of gives, and the same cause. The reason is the worker's own
// words when it raised the error there, else the whole message. So a lost worker stays PeerDied,
// and the worker concerned stays named, whatever was being done with it.
[[noreturn]] void rethrow_as(std::exception_ptr error, const std::string& what);

}  // namespace ferry::rpc
