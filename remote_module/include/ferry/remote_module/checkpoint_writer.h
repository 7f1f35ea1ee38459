// Checkpoints written in the background: a running job copies its state at a step and goes on
// training while a thread of the writer puts it on disk.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ferry/remote_module/checkpoint.h"

namespace ferry::remote_module {

// Writes checkpoints on a thread of its own, so that training goes on while they reach the disk:
// one at a time, in the order given, each as write_checkpoint writes it (LATEST last). At most
// one waits behind the one being written: a save() beyond that waits for the writer, which
// bounds the copies held to two. A failed write is rethrown by the next save() or wait(), and
// nothing after it is written. Resource type; save() and wait() from one thread.
class CheckpointWriter {
 public:
  // Called on the writer's thread once a checkpoint is on disk: its folder and the seconds the
  // write took.
  using Written = std::function<void(const std::string& folder, double seconds)>;

  CheckpointWriter();
  // Waits for what was given to be written; a failure then is logged, not thrown.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void save(std::string dir, CheckpointContent content, int keep, Written written = {});
  // Until every checkpoint given is on disk.
  void wait();

 private:
  struct Job {
    std::string dir;
    CheckpointContent content;
    int keep;
    Written written;
  };
  void run();
  void rethrow_failure();  // under mutex_

  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<Job> waiting_;  // under mutex_
  bool writing_ = false;        // under mutex_
  bool stopping_ = false;       // under mutex_
  std::exception_ptr failure_;  // under mutex_
  std::thread thread_;
};

}  // namespace ferry::remote_module
