// The one polling wait of Ferry's code: a condition looked at with a growing pause between looks,
// so that many waiters (a world's ranks at a rendezvous) do not flood what they poll.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace ferry::core {

// Looks at `done` until it holds (true) or `deadline` passes (false, after one last look). The
// pause grows by 5 ms a look, from 5 ms to `longest_pause`. Runs on the calling thread.
template <typename Done>
bool poll_with_backoff(Done done, std::chrono::steady_clock::time_point deadline,
                       std::chrono::milliseconds longest_pause = std::chrono::milliseconds(100)) {
  for (int attempt = 0;; ++attempt) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(
        std::min(std::chrono::milliseconds(5 + 5 * attempt), longest_pause));
  }
}

}  // namespace ferry::core
