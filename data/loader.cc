#include <omp.h>
#include <torch/torch.h>

#include <algorithm>
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

}  // namespace

BatchLoader::BatchLoader(std::shared_ptr<const Dataset> dataset, std::vector<std::size_t> indices,
                         int64_t batch_size, std::optional<std::uint64_t> shuffle_seed,
                         bool drop_last, int threads)
    : dataset_(std::move(dataset)),
      indices_(std::move(indices)),
      order_(indices_),
      batch_size_(batch_size),
      shuffle_seed_(shuffle_seed),
      drop_last_(drop_last),
      threads_(std::max(threads, 1)) {}

BatchLoader::~BatchLoader() { join(); }

void BatchLoader::join() {
  if (worker_.joinable()) worker_.join();
}

std::size_t BatchLoader::batches() const {
  if (drop_last_) return indices_.size() / batch_size_;
  return (indices_.size() + batch_size_ - 1) / batch_size_;
}

void BatchLoader::start_epoch(int epoch) {
  join();
  order_ = indices_;
  if (shuffle_seed_) {
    std::mt19937_64 rng(*shuffle_seed_ + static_cast<std::uint64_t>(epoch));
    std::shuffle(order_.begin(), order_.end(), rng);
  }
  cursor_ = 0;
  ready_.reset();
  failure_ = nullptr;
  if (batches() > 0) prefetch(0);
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
      for (std::size_t i = begin + t; i < end; i += threads_) samples[i - begin] = dataset_->get(order_[i]);
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

void BatchLoader::prefetch(std::size_t batch_index) {
  worker_ = std::thread([this, batch_index] {
    use_one_intra_op_thread();
    try {
      ready_ = build(batch_index);
    } catch (...) {
      failure_ = std::current_exception();
    }
  });
}

std::optional<Batch> BatchLoader::next() {
  if (cursor_ >= batches()) return std::nullopt;
  join();
  if (failure_) {
    std::exception_ptr failure = std::exchange(failure_, nullptr);
    cursor_ = batches();  // the epoch cannot go on without that batch
    std::rethrow_exception(failure);
  }
  std::optional<Batch> batch = std::move(ready_);
  ready_.reset();
  ++cursor_;
  if (cursor_ < batches()) prefetch(cursor_);
  return batch;
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
