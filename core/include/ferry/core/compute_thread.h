// One thread per process runs the heavy tensor work that requests bring (a stage's forward, a part
// of distributed backward, an optimizer step). LibTorch's OpenMP gives every thread that enters a
// parallel region a team of helper threads of its own, kept while that thread lives. Were that
// work spread over the pool, a worker would soon hold more OpenMP threads than CPUs, and libgomp
// then stops spinning between parallel regions: every region pays to wake its team (measured
// with `ferry-bench autograd`, docs/benchmarks.md). Pool threads hand such work here and wait
// for it.
//
// The work runs with the caller's LibTorch thread-local state (grad mode and the like) and with
// whatever per-thread state of their own the layers above carry over (rpc carries the caller's
// distributed autograd context), so it behaves as if run where it was called.
// Work must not wait for other work of the same process's compute thread: a request that the
// compute thread waits on must not itself need the compute thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace ferry::core {

// Runs `work` on the compute thread and returns when it has; rethrows what it threw. On the
// compute thread itself it runs at once.
void run_on_compute_thread(const std::function<void()>& work);

// Queues `work` on the compute thread and returns at once; it runs after what is queued already,
// as if where it was called. It must not throw (that would end the process): it reports
// failures through whatever it completes. For handlers that answer with a future instead of
// holding a pool thread while their work waits its turn.
void post_to_compute_thread(std::function<void()> work);

// For a process about to exit: drops the work queued and not started, refuses work posted from
// now on, and waits up to `timeout` for the work that runs to end. Static destructors free
// LibTorch's and oneDNN's kernels, which work still running would then call. True if the thread
// is idle. A caller of run_on_compute_thread whose work was dropped gets std::future_error.
bool stop_compute_thread(std::chrono::milliseconds timeout);

// `work` bound to this thread's state (as post_to_compute_thread would capture it) now, for work
// that is posted later from another thread: wherever it is posted from, it runs as if here.
std::function<void()> as_if_here(std::function<void()> work);

// Enters, on the compute thread, state captured on a caller's thread; what it returns is held
// while the work runs and then destroyed, which leaves that state. Empty: nothing to enter.
using EnterCaptured = std::function<std::shared_ptr<void>()>;
// Per-thread state that work handed to the compute thread takes along: from now on, `capture`
// runs on the thread that hands work over (any thread) and what it returns runs on the compute
// thread before the work. For the layer whose state core/ cannot know of (rpc's autograd
// context); one per process, a later call replaces it.
void carry_to_compute_thread(std::function<EnterCaptured()> capture);

// The same as run_on_compute_thread, returning what `work` returns.
template <typename F>
auto on_compute_thread(F&& work) -> std::invoke_result_t<F&> {
  using Result = std::invoke_result_t<F&>;
  if constexpr (std::is_void_v<Result>) {
    run_on_compute_thread(work);
  } else {
    std::optional<Result> result;
    run_on_compute_thread([&] { result.emplace(work()); });
    return std::move(*result);
  }
}

}  // namespace ferry::core
