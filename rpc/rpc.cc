// The process-wide state of rpc/: the default agent, created and destroyed by init()/shutdown()
// on user threads (the mutex keeps two threads from racing to do either), and the grad observer.
#include "ferry/rpc/rpc.h"

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "ferry/core/compute_thread.h"
#include "ferry/rpc/grad_observer.h"

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

// Peers may call this process while init() still waits for the rest of the world, and their
// functions may need agent(): it waits for init() to finish rather than fail.
std::condition_variable& init_done() {
  static std::condition_variable cv;
  return cv;
}
bool initializing = false;

}  // namespace

void init(Options options) {
  std::unique_lock<std::mutex> lock(default_mutex());
  if (default_agent() || initializing) {
    throw Error(ErrorKind::Init, "ferry::rpc::init() was already called in this process");
  }
  initializing = true;
  lock.unlock();
  std::unique_ptr<Agent> agent;
  try {
    agent = Agent::start(std::move(options));
  } catch (...) {
    lock.lock();
    initializing = false;
    init_done().notify_all();
    throw;
  }
  lock.lock();
  default_agent() = std::move(agent);
  initializing = false;
  init_done().notify_all();
}

void shutdown(bool graceful) {
  Agent* running = nullptr;
  {
    std::lock_guard<std::mutex> lock(default_mutex());
    running = default_agent().get();
  }
  if (running == nullptr) return;
  // Not under the lock: a graceful shutdown serves peers' calls, whose functions use agent().
  running->shutdown(graceful);
  std::unique_ptr<Agent> finished;
  std::lock_guard<std::mutex> lock(default_mutex());
  finished = std::move(default_agent());
}

Agent& agent() {
  std::unique_lock<std::mutex> lock(default_mutex());
  init_done().wait(lock, [] { return !initializing; });
  Agent* a = default_agent().get();
  if (a == nullptr) {
    throw Error(ErrorKind::Shutdown, "ferry::rpc::init() has not been called in this process");
  }
  return *a;
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(default_mutex());
  return default_agent() != nullptr;
}

namespace {

std::mutex& observer_mutex() {
  static std::mutex m;
  return m;
}
std::atomic<GradObserver*> current_observer{nullptr};

}  // namespace

void set_grad_observer(std::shared_ptr<GradObserver> observer) {
  // Work handed to the compute thread runs in the autograd context current where it was handed.
  static std::once_flag carried;
  std::call_once(carried, [] {
    core::carry_to_compute_thread([]() -> core::EnterCaptured {
      GradObserver* observer = grad_observer();
      GradTag context = observer ? observer->current() : GradTag{};
      if (!context.valid()) return nullptr;
      return [observer, context] { return observer->enter(context); };
    });
  });
  // Replaced observers stay alive: another thread may be inside one through grad_observer().
  static std::vector<std::shared_ptr<GradObserver>> kept;
  std::lock_guard<std::mutex> lock(observer_mutex());
  kept.push_back(observer);
  current_observer.store(observer.get());
}

GradObserver* grad_observer() { return current_observer.load(std::memory_order_acquire); }

}  // namespace ferry::rpc
