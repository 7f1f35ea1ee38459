// One thread per process runs the heavy tensor work that requests bring (a stage's forward, a part
// of distributed backward, an optimizer step). LibTorch's OpenMP gives every thread that enters a
// parallel region a team of helper threads of its own, kept while that thread lives. Were that
// work spread over the pool, a worker would soon hold more OpenMP threads than CPUs, and libgomp
// then stops spinning between parallel regions: every region pays to wake its team. On a 2-core
// machine that made a U-Net stage's forward 1.5x slower on a worker than the same code on one
// thread (`ferry-bench autograd`). Pool threads hand such work here and wait for it.
//
// The work runs with the caller's LibTorch thread-local state (grad mode and the like) and the
// caller's distributed autograd context, so it behaves as if run where it was called.
// Work must not wait for other work of the same process's compute thread: a request that the
// compute thread waits on must not itself need the compute thread.
#pragma once

#include <functional>
#include <optional>
#include <type_traits>
#include <utility>

namespace ferry::rpc {

// Runs `work` on the compute thread and returns when it has; rethrows what it threw. On the
// compute thread itself it runs at once.
void run_on_compute_thread(const std::function<void()>& work);

// Queues `work` on the compute thread and returns at once; it runs after what is queued already,
// with the caller's thread-local state and autograd context. It must not throw (that would end
// the process): it reports failures through whatever it completes. For handlers that answer
// with a future instead of holding a pool thread while their work waits its turn.
void post_to_compute_thread(std::function<void()> work);

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

}  // namespace ferry::rpc
