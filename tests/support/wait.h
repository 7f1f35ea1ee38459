// The one bounded wait of the tests: poll a condition until it holds or a limit passes. Limits
// are scaled (time_scale.h).
#pragma once

#include <chrono>
#include <thread>

#include "tests/support/time_scale.h"

namespace ferry::testing {

// Looks at `done` every `poll` for up to scaled(`limit`); true as soon as it holds, false if it
// never did (one last look is taken at the limit, so a condition that came true during the final
// sleep still counts).
template <typename Done, typename Rep, typename Period>
bool wait_until(Done done, std::chrono::duration<Rep, Period> limit,
                std::chrono::milliseconds poll = std::chrono::milliseconds(20)) {
  const auto end = std::chrono::steady_clock::now() + scaled(limit);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(poll);
  }
  return done();
}

}  // namespace ferry::testing
