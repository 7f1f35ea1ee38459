#include "ferry/remote_module/checkpoint_writer.h"

#include <chrono>

#include "ferry/core/log.h"

namespace ferry::remote_module {

CheckpointWriter::CheckpointWriter() : thread_([this] { run(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return !waiting_ && !writing_; });
    stopping_ = true;
    if (failure_) {
      try {
        std::rethrow_exception(failure_);
      } catch (const std::exception& e) {
        log::error("a checkpoint was not written: {}", e.what());
      }
    }
  }
  changed_.notify_all();
  thread_.join();
}

void CheckpointWriter::rethrow_failure() {
  if (!failure_) return;
  std::exception_ptr failure = failure_;
  failure_ = nullptr;
  std::rethrow_exception(failure);
}

void CheckpointWriter::save(std::string dir, CheckpointContent content, int keep, Written written) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return !waiting_ || failure_; });
  rethrow_failure();
  waiting_ = Job{std::move(dir), std::move(content), keep, std::move(written)};
  lock.unlock();
  changed_.notify_all();
}

void CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return (!waiting_ && !writing_) || failure_; });
  rethrow_failure();
}

void CheckpointWriter::run() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return stopping_ || (waiting_ && !failure_); });
    if (stopping_) return;
    Job job = std::move(*waiting_);
    waiting_.reset();
    writing_ = true;
    lock.unlock();
    changed_.notify_all();
    std::exception_ptr failure;
    const auto start = std::chrono::steady_clock::now();
    try {
      const std::string folder = write_checkpoint(job.dir, job.content, job.keep);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (job.written) job.written(folder, seconds);
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    writing_ = false;
    if (failure) {
      failure_ = failure;
      waiting_.reset();  // nothing after a failed write: it would skip over the lost one
    }
    lock.unlock();
    changed_.notify_all();
  }
}

}  // namespace ferry::remote_module
