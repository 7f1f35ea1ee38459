// The default agent is created and destroyed by init()/shutdown() on user threads; the mutex
// keeps two threads from racing to do either.
#include "ferry/rpc/rpc.h"

#include <mutex>

namespace ferry::rpc {
namespace {

std::mutex& default_mutex() {
  static std::mutex m;
  return m;
}

std::unique_ptr<Agent>& default_agent() {
  static std::unique_ptr<Agent> agent;
  return agent;
}

}  // namespace

void init(Options options) {
  std::lock_guard<std::mutex> lock(default_mutex());
  if (default_agent()) {
    throw Error(ErrorKind::Init, fmt::format("init() was already called (this process is {})",
                                             default_agent()->self().describe()));
  }
  default_agent() = Agent::start(std::move(options));
}

void shutdown(bool graceful) {
  std::unique_ptr<Agent> agent;
  {
    std::lock_guard<std::mutex> lock(default_mutex());
    if (!default_agent()) return;
    default_agent()->shutdown(graceful);
    agent = std::move(default_agent());
  }
}

Agent& agent() {
  Agent* a = default_agent().get();
  if (a == nullptr) {
    throw Error(ErrorKind::Shutdown, "ferry::rpc::init() has not been called in this process");
  }
  return *a;
}

bool is_initialized() { return default_agent() != nullptr; }

}  // namespace ferry::rpc
