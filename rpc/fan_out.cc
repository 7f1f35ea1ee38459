#include "ferry/rpc/fan_out.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <memory>

#include "ferry/rpc/rpc.h"

namespace ferry::rpc {

FuturePtr when_all(const std::vector<FuturePtr>& futures) {
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

void FanOut::call(const std::string& worker, const std::string& function,
                  std::vector<c10::IValue> args, std::string label) {
  add(rpc_async(worker, function, std::move(args)), worker, std::move(label));
}

void FanOut::add(FuturePtr future, std::string worker, std::string label) {
  futures_.push_back(std::move(future));
  workers_.push_back(std::move(worker));
  labels_.push_back(std::move(label));
}

std::vector<c10::IValue> FanOut::wait(const std::string& what) const {
  when_all(futures_)->wait();
  std::vector<c10::IValue> values;
  std::vector<std::exception_ptr> failures(futures_.size());
  std::vector<std::string> told;
  for (std::size_t i = 0; i < futures_.size(); ++i) {
    if (!futures_[i]->hasError()) {
      values.push_back(futures_[i]->value());
      continue;
    }
    failures[i] = futures_[i]->exception_ptr();
    const Failure failure = failure_of(failures[i]);
    // Labels are formatted here, on failure only: the optimizer fans out every step.
    told.push_back(fmt::format(
        "{}: {}", labels_[i].empty() ? fmt::format("on worker \"{}\"", workers_[i]) : labels_[i],
        failure.cause.empty() ? failure.message : failure.cause));
  }
  const std::exception_ptr picked = first_failure(failures);
  if (!picked) return values;
  std::size_t index = 0;
  while (failures[index] != picked) ++index;
  const Failure failure = failure_of(picked);
  const std::string list = fmt::format("{}", fmt::join(told, "; "));
  throw Error(failure.kind, what.empty() ? list : fmt::format("{} failed {}", what, list), "",
              failure.worker.empty() ? workers_[index] : failure.worker);
}

}  // namespace ferry::rpc
