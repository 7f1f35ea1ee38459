#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "ferry/data/dataset.h"

namespace ferry::data {

BatchLoader::BatchLoader(std::shared_ptr<const Dataset> dataset, std::vector<std::size_t> indices,
                         int64_t batch_size, std::optional<std::uint64_t> shuffle_seed)
    : dataset_(std::move(dataset)),
      indices_(std::move(indices)),
      order_(indices_),
      batch_size_(batch_size),
      shuffle_seed_(shuffle_seed) {}

BatchLoader::~BatchLoader() { join(); }

void BatchLoader::join() {
  if (worker_.joinable()) worker_.join();
}

std::size_t BatchLoader::batches() const {
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
  if (batches() > 0) prefetch(0);
}

Batch BatchLoader::build(std::size_t batch_index) const {
  std::size_t begin = batch_index * batch_size_;
  std::size_t end = std::min(order_.size(), begin + batch_size_);
  std::vector<at::Tensor> images, masks;
  for (std::size_t i = begin; i < end; ++i) {
    Sample sample = dataset_->get(order_[i]);
    images.push_back(sample.image);
    masks.push_back(sample.mask);
  }
  return {torch::stack(images), torch::stack(masks)};
}

void BatchLoader::prefetch(std::size_t batch_index) {
  worker_ = std::thread([this, batch_index] {
    // Building is a little tensor work; one thread keeps it off the stages' cores.
    at::set_num_threads(1);
    ready_ = build(batch_index);
  });
}

std::optional<Batch> BatchLoader::next() {
  if (cursor_ >= batches()) return std::nullopt;
  join();
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
