#include "ferry/core/neighbours.h"

#include <ATen/Parallel.h>

#include <utility>

namespace ferry::core {

Neighbours::Neighbours(int count, Pass pass) : pass_(std::move(pass)) {
  try {
    for (int k = 0; k < count; ++k) threads_.emplace_back([this, k] { run(k); });
  } catch (...) {
    join();
    throw;
  }
}

Neighbours::~Neighbours() { join(); }

void Neighbours::stop() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const int count = static_cast<int>(threads_.size());
    passed_.wait(lock, [&] { return first_passes_ >= count; });
  }
  join();
  if (failure_) std::rethrow_exception(failure_);
}

void Neighbours::run(int index) {
  // A stage has one intra-op thread when its neighbours share the machine; so does each of these.
  at::set_num_threads(1);
  bool first = true;
  auto count_first = [&] {
    if (!first) return;
    first = false;
    std::lock_guard<std::mutex> lock(mutex_);
    ++first_passes_;
    passed_.notify_all();
  };
  try {
    while (!stop_) {
      pass_(index, stop_);
      count_first();
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_) failure_ = std::current_exception();
    }
    count_first();
  }
}

void Neighbours::join() {
  stop_ = true;
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

}  // namespace ferry::core
