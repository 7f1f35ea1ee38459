// Requests of one step, let through in micro-batch order whatever order they arrive in. A
// stage's forwards, and its backwards, start this way: handlers run on several pool threads, and
// a batch norm's running statistics, or a sum of gradients over more than two micro-batches,
// come out different in another order, so a run would not repeat itself. Private to pipeline/.
//
// Thread rules: not thread-safe; its owner calls it under its own lock.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "ferry/rpc/error.h"

namespace ferry::pipeline {

template <typename Request>
class InOrder {
 public:
  // `request`, micro-batch `microbatch` of step `context`, joins. Returns the requests that may
  // start now, in micro-batch order (none while an earlier micro-batch has not arrived). A
  // request of an older or abandoned step, and those still waiting from one when a newer step
  // begins, go to `abandoned`. Throws rpc::Error(InvalidArgument) for a negative micro-batch or
  // one that came before in this step.
  std::vector<Request> take(std::int64_t context, std::int64_t microbatch, Request request,
                            std::vector<Request>* abandoned) {
    if (discarded(context)) {
      abandoned->push_back(std::move(request));
      return {};
    }
    if (context > context_) {
      for (auto& [m, waiting] : early_) abandoned->push_back(std::move(waiting));
      early_.clear();
      context_ = context;
      next_ = 0;
      abandoned_ = false;
    }
    if (microbatch < 0) {
      throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                       fmt::format("micro-batch {}: micro-batches count from 0", microbatch));
    }
    if (microbatch < next_ || early_.count(microbatch) > 0) {
      throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                       fmt::format("micro-batch {} of this step came a second time", microbatch));
    }
    early_.emplace(microbatch, std::move(request));
    std::vector<Request> ready;
    for (auto it = early_.find(next_); it != early_.end(); it = early_.find(next_)) {
      ready.push_back(std::move(it->second));
      early_.erase(it);
      ++next_;
    }
    return ready;
  }

  // The current step was discarded: what waits goes to `abandoned`, and so does whatever of the
  // step comes later.
  void abandon(std::vector<Request>* abandoned) {
    for (auto& [m, waiting] : early_) abandoned->push_back(std::move(waiting));
    early_.clear();
    abandoned_ = true;
  }

  // Whether step `context` is older than the one being ordered, or was discarded: work of it
  // that was already running when it was must leave nothing behind.
  bool discarded(std::int64_t context) const {
    return context < context_ || (context == context_ && abandoned_);
  }

  // Requests that arrived before an earlier micro-batch of their step.
  std::size_t waiting() const { return early_.size(); }

 private:
  std::int64_t context_ = 0;               // the step being ordered; older ones were abandoned
  std::int64_t next_ = 0;                  // the micro-batch that may start next
  std::map<std::int64_t, Request> early_;  // arrived before an earlier micro-batch
  bool abandoned_ = false;                 // the step was discarded
};

}  // namespace ferry::pipeline
