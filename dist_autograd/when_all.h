// Waiting on a group of calls without holding a thread. Internal to dist_autograd/.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <memory>
#include <vector>

namespace ferry::dist_autograd {

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

// Completes with None once every future in `futures` has completed, failed or not; the caller
// looks at each. Completes at once for an empty group.
inline FuturePtr when_all(const std::vector<FuturePtr>& futures) {
  auto done = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
  if (futures.empty()) {
    done->markCompleted();
    return done;
  }
  auto left = std::make_shared<std::atomic<std::size_t>>(futures.size());
  for (const auto& future : futures) {
    future->addCallback([done, left](c10::ivalue::Future&) {
      if (left->fetch_sub(1) == 1) done->markCompleted();
    });
  }
  return done;
}

}  // namespace ferry::dist_autograd
