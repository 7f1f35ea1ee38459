#include "ferry/remote_module/checkpoint_writer.h"

#include <chrono>

#include "ferry/core/log.h"

namespace ferry::remote_module {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

CheckpointWriter::CheckpointWriter()
    : taker_([this] { take_loop(); }), writer_([this] { write_loop(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return !to_take_ && !taking_ && !to_write_ && !writing_; });
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
  taker_.join();
  writer_.join();
}

void CheckpointWriter::rethrow_failure() {
  if (!failure_) return;
  std::exception_ptr failure = failure_;
  failure_ = nullptr;
  std::rethrow_exception(failure);
}

void CheckpointWriter::save(std::string dir, Take take, int keep, Written written,
                            bool replaceable) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return (!to_take_ && !taking_) || failure_; });
  rethrow_failure();
  to_take_ = Job{std::move(dir), std::move(take), keep, std::move(written), replaceable, {}, 0};
  lock.unlock();
  changed_.notify_all();
}

void CheckpointWriter::save(std::string dir, CheckpointContent content, int keep, Written written) {
  save(
      std::move(dir), [content = std::move(content)] { return content; }, keep, std::move(written));
}

void CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock,
                [this] { return (!to_take_ && !taking_ && !to_write_ && !writing_) || failure_; });
  rethrow_failure();
}

void CheckpointWriter::wait_taken() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return (!to_take_ && !taking_) || failure_; });
  rethrow_failure();
}

std::optional<CheckpointContent> CheckpointWriter::last_taken() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_taken_;
}

void CheckpointWriter::take_loop() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return stopping_ || to_take_; });
    if (stopping_) return;
    Job job = std::move(*to_take_);
    to_take_.reset();
    taking_ = true;
    lock.unlock();
    changed_.notify_all();
    std::exception_ptr failure;
    const auto start = std::chrono::steady_clock::now();
    try {
      job.content = job.take();
      job.take = nullptr;  // what it held on the workers may go
    } catch (...) {
      failure = std::current_exception();
    }
    job.take_s = seconds_since(start);
    lock.lock();
    if (failure) {
      failure_ = failure;
    } else {
      last_taken_ = job.content;
      // One waits for the writer at most: a replaceable one of the same directory gives way.
      changed_.wait(lock, [this, &job] {
        return stopping_ || !to_write_ || (to_write_->replaceable && to_write_->dir == job.dir);
      });
      to_write_ = std::move(job);
    }
    taking_ = false;
    lock.unlock();
    changed_.notify_all();
  }
}

void CheckpointWriter::write_loop() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return stopping_ || to_write_; });
    if (stopping_) return;
    Job job = std::move(*to_write_);
    to_write_.reset();
    writing_ = true;
    lock.unlock();
    changed_.notify_all();
    std::exception_ptr failure;
    const auto start = std::chrono::steady_clock::now();
    try {
      const std::string folder = write_checkpoint(job.dir, job.content, job.keep);
      if (job.written) job.written(folder, job.take_s, seconds_since(start));
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    writing_ = false;
    if (failure) failure_ = failure;
    lock.unlock();
    changed_.notify_all();
  }
}

}  // namespace ferry::remote_module
