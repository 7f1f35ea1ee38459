// Stopping an agent: its own calls drained, the barrier that lets every agent finish serving
// before any leaves, then the loop and the pool. User thread.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ferry/core/backoff.h"
#include "ferry/core/log.h"
#include "rpc/agent_state.h"

namespace ferry::rpc {

void Agent::State::drain_own_calls(Clock::time_point deadline) {
  if (std::size_t left = calls.wait_until_empty(deadline)) {
    log::warn("shutdown: {} calls still pending at the deadline; they will be cancelled", left);
  }
}

void Agent::State::barrier(Clock::time_point deadline) {
  rendezvous->arrive_shutdown();
  std::vector<int> missing;
  const bool all = core::poll_with_backoff(
      [&] {
        missing = rendezvous->missing_shutdown(lost());
        return missing.empty();
      },
      deadline, std::chrono::milliseconds(50));
  if (!all) {
    std::vector<std::string> names;
    for (int r : missing) names.push_back(workers[r].describe());
    log::warn("shutdown: {} did not reach shutdown in time; going on without them",
              fmt::join(names, ", "));
  }
  if (self.rank == 0) {
    // The store lives in this process: keep it up until the others are done reading it.
    rendezvous->wait_left(lost(), std::max(deadline, Clock::now() + std::chrono::seconds(1)));
  } else {
    rendezvous->leave();
  }
}

void Agent::State::stop(bool graceful) {
  std::lock_guard<std::mutex> lock(shutdown_mutex);
  if (shut_down) return;
  shut_down = true;
  auto deadline = Clock::now() + options.shutdown_timeout;
  if (graceful && is_running()) {
    drain_own_calls(deadline);
    try {
      barrier(deadline);
    } catch (const std::exception& e) {
      log::warn("shutdown: the rendezvous store is gone ({}); stopping without the barrier",
                e.what());
    }
  }
  set_phase(Phase::Stopped);
  if (rrefs) rrefs->stop();
  stop_loop();
  for (PendingCall& call : calls.take_all()) {
    auto eptr = std::make_exception_ptr(
        Error(ErrorKind::Shutdown, fmt::format("call \"{}\" to {} was cancelled by shutdown",
                                               call.function, workers[call.to_rank].describe())));
    call.future->setErrorIfNeeded(eptr);
  }
  pool.reset();
  rendezvous.reset();
}

}  // namespace ferry::rpc
