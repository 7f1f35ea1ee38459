#include <omp.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <thread>
#include <utility>

#include "ferry/data/dataset.h"

namespace ferry::data {
namespace {

// Reading samples is light tensor work; one intra-op thread keeps it off the stages' cores.
// at::set_num_threads would change every thread's setting, not only this one's: OpenMP's own
// setting is per thread, once ATen has made its first (lazy) one.
void use_one_intra_op_thread() {
  at::internal::lazy_init_num_threads();
  omp_set_num_threads(1);
}

// A sample's draw: its epoch and its place in the epoch's order (below 2^63, where
// Dataset::get's own draws start).
std::uint64_t draw_key(int epoch, std::size_t place) {
  return (static_cast<std::uint64_t>(epoch) << 32) + place;
}

}  // namespace

BatchLoader::BatchLoader(std::shared_ptr<const Dataset> dataset, std::vector<std::size_t> indices,
                         int64_t batch_size, std::optional<std::uint64_t> shuffle_seed,
                         bool drop_last, int threads, int prefetch)
    : dataset_(std::move(dataset)),
      indices_(std::move(indices)),
      order_(indices_),
      batch_size_(batch_size),
      shuffle_seed_(shuffle_seed),
      drop_last_(drop_last),
      threads_(std::max(threads, 1)),
      prefetch_(static_cast<std::size_t>(std::max(prefetch, 1))) {}

BatchLoader::~BatchLoader() { stop(); }

void BatchLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (builder_.joinable()) builder_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  ready_.clear();
  stopping_ = false;
}

std::size_t BatchLoader::batches() const {
  if (drop_last_) return indices_.size() / batch_size_;
  return (indices_.size() + batch_size_ - 1) / batch_size_;
}

void BatchLoader::start_epoch(int epoch, std::size_t first_batch) {
  stop();
  order_ = indices_;
  if (shuffle_seed_) {
    std::mt19937_64 rng(*shuffle_seed_ + static_cast<std::uint64_t>(epoch));
    std::shuffle(order_.begin(), order_.end(), rng);
  }
  epoch_ = epoch;
  cursor_ = std::min(first_batch, batches());
  if (cursor_ < batches()) builder_ = std::thread([this, first = cursor_] { produce(first); });
}

Batch BatchLoader::build(std::size_t batch_index) const {
  std::size_t begin = batch_index * batch_size_;
  std::size_t end = std::min(order_.size(), begin + batch_size_);
  std::vector<Sample> samples(end - begin);
  std::vector<std::exception_ptr> failures(threads_);
  // Thread t reads samples t, t + threads, ...: reading and decoding files is most of the work.
  auto read = [&](int t) {
    use_one_intra_op_thread();
    try {
      for (std::size_t i = begin + t; i < end; i += threads_)
        samples[i - begin] = dataset_->get_drawn(order_[i], draw_key(epoch_, i));
    } catch (...) {
      failures[t] = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < threads_; ++t) helpers.emplace_back(read, t);
  read(0);
  for (auto& h : helpers) h.join();
  for (auto& f : failures) {
    if (f) std::rethrow_exception(f);
  }
  std::vector<at::Tensor> images, masks;
  for (Sample& s : samples) {
    images.push_back(s.image);
    masks.push_back(s.mask);
  }
  return {torch::stack(images), torch::stack(masks)};
}

// The builder thread: the epoch's batches in order, each handed over once fewer than `prefetch_`
// wait; after a failure, none.
void BatchLoader::produce(std::size_t first_batch) {
  use_one_intra_op_thread();
  for (std::size_t b = first_batch; b < batches(); ++b) {
    Built built;
    try {
      built.batch = build(b);
    } catch (...) {
      built.failure = std::current_exception();
    }
    const bool failed = built.failure != nullptr;
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return stopping_ || ready_.size() < prefetch_; });
    if (stopping_) return;
    ready_.push_back(std::move(built));
    lock.unlock();
    changed_.notify_all();
    if (failed) return;
  }
}

std::optional<Batch> BatchLoader::next() {
  if (cursor_ >= batches() || !builder_.joinable()) return std::nullopt;  // no epoch started
  const auto start = std::chrono::steady_clock::now();
  Built built;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // The builder hands over every batch of the epoch, or a failure that ends it.
    changed_.wait(lock, [this] { return !ready_.empty(); });
    built = std::move(ready_.front());
    ready_.pop_front();
  }
  changed_.notify_all();
  waited_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++cursor_;
  if (built.failure) {
    cursor_ = batches();  // the epoch cannot go on without that batch
    std::rethrow_exception(built.failure);
  }
  return std::move(built.batch);
}

std::pair<std::vector<std::size_t>, std::vector<std::size_t>> split_indices(
    std::size_t n, double validation_share) {
  std::size_t validation = static_cast<std::size_t>(n * validation_share);
  std::vector<std::size_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  return {std::vector<std::size_t>(all.begin(), all.end() - validation),
          std::vector<std::size_t>(all.end() - validation, all.end())};
}

}  // namespace ferry::data
