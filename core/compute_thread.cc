#include "ferry/core/compute_thread.h"

#include <ATen/ThreadLocalState.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <mutex>
#include <thread>

namespace ferry::core {
namespace {

class ComputeThread {
 public:
  ComputeThread() : thread_([this] { loop(); }) { id_ = thread_.get_id(); }

  void post(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopped_) return;  // dropped outside the lock, as `work` goes
      queue_.push_back(std::move(work));
    }
    ready_.notify_one();
  }
  bool here() const { return std::this_thread::get_id() == id_; }

  bool stop(std::chrono::milliseconds timeout) {
    std::deque<std::function<void()>> dropped;
    std::unique_lock<std::mutex> lock(mutex_);
    stopped_ = true;
    dropped.swap(queue_);
    const bool idle = idle_.wait_for(lock, timeout, [this] { return !busy_; });
    lock.unlock();
    dropped.clear();  // their callers' promises break: run_on_compute_thread throws there
    return idle;
  }

 private:
  [[noreturn]] void loop() {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        busy_ = false;
        idle_.notify_all();
        ready_.wait(lock, [this] { return !queue_.empty(); });
        work = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      work();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_, idle_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false;
  bool stopped_ = false;
  std::thread thread_;
  std::thread::id id_;
};

// Never destroyed: the thread waits for work until the process exits, and static destructors
// must not join a thread that may be inside LibTorch.
ComputeThread& compute_thread() {
  static ComputeThread* thread = new ComputeThread();
  return *thread;
}

// Never destroyed either: a thread may hand work over while the process exits.
std::mutex carrier_mutex;
std::function<EnterCaptured()>& carrier() {  // guarded by carrier_mutex
  static auto* capture = new std::function<EnterCaptured()>();
  return *capture;
}

}  // namespace

// With the caller's LibTorch thread-local state and what the carrier captures.
std::function<void()> as_if_here(std::function<void()> work) {
  EnterCaptured enter;
  {
    std::lock_guard<std::mutex> lock(carrier_mutex);
    if (carrier()) enter = carrier()();
  }
  return [work = std::move(work), state = at::ThreadLocalState(), enter = std::move(enter)] {
    at::ThreadLocalStateGuard guard(state);
    std::shared_ptr<void> entered = enter ? enter() : nullptr;
    work();
  };
}

void run_on_compute_thread(const std::function<void()>& work) {
  ComputeThread& thread = compute_thread();
  if (thread.here()) {
    work();
    return;
  }
  // The work owns the promise: the caller may return (and its frame go) as soon as it is set,
  // and work dropped unrun (stop_compute_thread) breaks it, so that the caller does not wait on.
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  thread.post(as_if_here([&work, done = std::move(done)] {
    try {
      work();
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }));
  finished.get();
}

bool stop_compute_thread(std::chrono::milliseconds timeout) {
  return compute_thread().stop(timeout);
}

void post_to_compute_thread(std::function<void()> work) {
  compute_thread().post(as_if_here(std::move(work)));
}

void carry_to_compute_thread(std::function<EnterCaptured()> capture) {
  std::lock_guard<std::mutex> lock(carrier_mutex);
  carrier() = std::move(capture);
}

}  // namespace ferry::core
