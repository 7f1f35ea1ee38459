// Threads that compute beside a measurement, as the other stages on a machine compute beside a
// stage. A stage's compute slows by a few percent while its neighbours share the memory bus and
// caches, so a cost or a baseline measured alone does not predict it; one measured beside as many
// neighbours does.
//
// Thread rules: the constructor starts one thread per neighbour; each calls `pass` over and over
// with one intra-op thread until stop() or the destructor. stop() first lets every neighbour
// finish one pass, so that whatever was measured before it ran beside each of them at least once
// (on a busy machine a thread may start late). stop() and the destructor run on the thread that
// made the object.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry::core {

// A resource: not copyable, one owner.
class Neighbours {
 public:
  // One pass of neighbour `index` (0 .. count - 1). It must end by itself, and should end soon
  // once `stop` is set (a pass of many blocks or micro-batches looks between them), so that
  // stop() is prompt; `stop` is never set before every neighbour has finished one pass.
  using Pass = std::function<void(int index, const std::atomic<bool>& stop)>;

  // `count` threads; none when it is 0.
  Neighbours(int count, Pass pass);
  ~Neighbours();
  Neighbours(const Neighbours&) = delete;
  Neighbours& operator=(const Neighbours&) = delete;

  // Waits until every neighbour has finished a pass (or failed), then stops them all and waits
  // for them; rethrows the first failure of a pass.
  void stop();

 private:
  void run(int index);
  void join();

  Pass pass_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable passed_;
  int first_passes_ = 0;  // neighbours that finished a pass or failed; under mutex_
  std::exception_ptr failure_;
  std::vector<std::thread> threads_;
};

}  // namespace ferry::core
