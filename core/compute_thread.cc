#include "ferry/core/compute_thread.h"

#include <ATen/ThreadLocalState.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry::core {
namespace {

class ComputeThread {
 public:
  ComputeThread() : thread_([this] { loop(); }) { id_ = thread_.get_id(); }

  void post(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(work));
    }
    ready_.notify_one();
  }
  bool here() const { return std::this_thread::get_id() == id_; }

 private:
  [[noreturn]] void loop() {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return !queue_.empty(); });
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      work();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> queue_;
  std::thread thread_;
  std::thread::id id_;
};

// Never destroyed: the thread waits for work until the process exits, and static destructors
// must not join a thread that may be inside LibTorch.
ComputeThread& compute_thread() {
  static ComputeThread* thread = new ComputeThread();
  return *thread;
}

std::mutex carriers_mutex;
std::vector<std::function<EnterCaptured()>>& carriers() {
  static auto* list = new std::vector<std::function<EnterCaptured()>>();
  return *list;
}

// `work` wrapped to run there as if where it was called: with the caller's LibTorch
// thread-local state and what the carriers capture.
std::function<void()> as_if_here(std::function<void()> work) {
  std::vector<EnterCaptured> captured;
  {
    std::lock_guard<std::mutex> lock(carriers_mutex);
    for (const auto& capture : carriers()) {
      EnterCaptured enter = capture();
      if (enter) captured.push_back(std::move(enter));
    }
  }
  return [work = std::move(work), state = at::ThreadLocalState(), captured = std::move(captured)] {
    at::ThreadLocalStateGuard guard(state);
    std::vector<std::shared_ptr<void>> entered;
    entered.reserve(captured.size());
    for (const EnterCaptured& enter : captured) entered.push_back(enter());
    work();
    while (!entered.empty()) entered.pop_back();  // left in the reverse order of entering
  };
}

}  // namespace

void run_on_compute_thread(const std::function<void()>& work) {
  ComputeThread& thread = compute_thread();
  if (thread.here()) {
    work();
    return;
  }
  // The promise is shared: the caller may return (and its frame go) as soon as it is set.
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  thread.post(as_if_here([&work, done] {
    try {
      work();
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }));
  finished.get();
}

void post_to_compute_thread(std::function<void()> work) {
  compute_thread().post(as_if_here(std::move(work)));
}

void carry_to_compute_thread(std::function<EnterCaptured()> capture) {
  std::lock_guard<std::mutex> lock(carriers_mutex);
  carriers().push_back(std::move(capture));
}

}  // namespace ferry::core
