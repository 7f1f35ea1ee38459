// Checkpoints written in the background: a running job takes its state at a step (copies held
// where they are, or brought here) and goes on training while the writer brings the copies here
// and puts them on disk.
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

// Two threads of its own: one brings each checkpoint's content here (a Take: fetching copies that
// the workers hold), the other writes it as write_checkpoint does (LATEST last), in the order
// given. save() first waits until the checkpoint before has been brought here, so that one is
// always here once the next is given. At most one checkpoint waits for the writing thread; a
// `replaceable` one that still waits when a newer one of the same directory arrives is not
// written (a disk slower than the checkpoints does not hold up training). A failure (a take
// whose worker is lost, a write that cannot be made) is rethrown once, by the next save(),
// wait() or wait_taken(); a failed take's checkpoint is not written, and the checkpoints after a
// failed one still are. Resource type; save() and the waits from one thread.
class CheckpointWriter {
 public:
  using Take = std::function<CheckpointContent()>;
  // Called on the writing thread once a checkpoint is on disk: its folder and the seconds the
  // fetch and the write took.
  using Written = std::function<void(const std::string& folder, double take_s, double write_s)>;

  CheckpointWriter();
  // Waits for what was given to be written; a failure then is logged, not thrown.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void save(std::string dir, Take take, int keep, Written written = {}, bool replaceable = false);
  void save(std::string dir, CheckpointContent content, int keep, Written written = {});
  // Until every checkpoint given is on disk.
  void wait();
  // Until every checkpoint given has been brought here (not yet written, perhaps).
  void wait_taken();
  // The newest checkpoint brought here (the last one given, after wait_taken() unless it
  // failed), for a job that goes back to it without reading the disk; none before the first.
  std::optional<CheckpointContent> last_taken() const;

 private:
  struct Job {
    std::string dir;
    Take take;
    int keep;
    Written written;
    bool replaceable;
    CheckpointContent content;  // once taken
    double take_s = 0;
  };
  void take_loop();
  void write_loop();
  void rethrow_failure();  // under mutex_

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<Job> to_take_, to_write_;        // under mutex_: waiting for each thread
  bool taking_ = false, writing_ = false;        // under mutex_
  bool stopping_ = false;                        // under mutex_
  std::exception_ptr failure_;                   // under mutex_
  std::optional<CheckpointContent> last_taken_;  // under mutex_
  std::thread taker_, writer_;
};

}  // namespace ferry::remote_module
