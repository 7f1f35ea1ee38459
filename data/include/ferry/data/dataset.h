// Segmentation data: images with their masks, and batches of them prepared on a background thread
// so the stages never wait on data.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ferry::data {

// One image [3, H, W] in [0, 1] and its mask [1, H, W] of 0 and 1. Value type.
struct Sample {
  at::Tensor image;
  at::Tensor mask;
};

// Thread rules: get() may be called from any thread, concurrently.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::size_t size() const = 0;
  virtual Sample get(std::size_t index) const = 0;
};

// Filled ellipses and convex polygons on textured noise, with their masks: deterministic from
// (seed, index), so a run needs nothing downloaded and two runs see the same data.
class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(std::size_t count, int64_t image_size, std::uint64_t seed);
  std::size_t size() const override { return count_; }
  Sample get(std::size_t index) const override;

 private:
  std::size_t count_;
  int64_t image_size_;
  std::uint64_t seed_;
};

// Images and masks from a folder: DIR/images/NAME.{png,jpg,jpeg} with DIR/masks/NAME.* (any of
// those extensions), paired by NAME. Masks are read as grey levels: above half of their range is
// foreground (masks saved as 0/1 and as 0/255 both work). Each sample comes out at
// image_size x image_size: resized, or with `crop` cut out of the image (at random with
// `augment`, else from the centre). `augment` also flips at random, horizontally and vertically,
// image and mask alike.
class FolderDataset final : public Dataset {
 public:
  struct Options {
    int64_t image_size = 256;
    bool crop = false;
    bool augment = false;
    std::uint64_t seed = 0;
  };
  // Lists and pairs the files; throws std::invalid_argument naming the folder or file when
  // a folder is missing or empty, or an image has no mask. Files are read in get(), which throws
  // naming the file that is unreadable, smaller than a crop, or whose mask's size differs.
  FolderDataset(const std::string& dir, Options options);
  std::size_t size() const override { return images_.size(); }
  Sample get(std::size_t index) const override;

 private:
  std::vector<std::string> images_, masks_;
  Options options_;
  mutable std::atomic<std::uint64_t> draws_{0};  // each get() draws its own augmentation
};

// The image files (PNG, JPEG) directly in `dir`, by name (the file's stem). Throws
// std::invalid_argument naming the folder if it is none, or two files of one name.
std::map<std::string, std::string> image_files(const std::string& dir);

// An image file as the model takes it, at image_size x image_size as FolderDataset resizes it
// (area averaging; RGB in [0, 1], [3, S, S]), with the size it had. Throws std::invalid_argument
// naming the file.
struct ImageFile {
  at::Tensor pixels;
  int64_t height = 0, width = 0;
};
ImageFile read_image(const std::string& path, int64_t image_size);

// A mask file at its own size as FolderDataset reads it: [H, W] of 0 and 1 (float). Throws
// std::invalid_argument naming the file.
at::Tensor read_mask(const std::string& path);
// Writes a mask [H, W] of 0 and 1 (any dtype) as a grey image of 0 and 255, in the format the
// extension of `path` names (PNG for .png). Throws std::invalid_argument naming the file.
void write_mask(const at::Tensor& mask, const std::string& path);

// A batch: images [B, 3, H, W], masks [B, 1, H, W].
struct Batch {
  at::Tensor images;
  at::Tensor masks;
};

// Batches of `indices` of `dataset` in order (shuffled per epoch when `shuffle_seed` is set), the
// next one always being built in the background while the current one is used, its samples read
// by `threads` threads at once. With `drop_last`, a last batch smaller than `batch_size` is left
// out (batch norm cannot train on a batch of one). A sample that fails to load fails next() with
// its error. Resource type; used by one thread.
class BatchLoader {
 public:
  BatchLoader(std::shared_ptr<const Dataset> dataset, std::vector<std::size_t> indices,
              int64_t batch_size, std::optional<std::uint64_t> shuffle_seed, bool drop_last = false,
              int threads = 2);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Batches per epoch (the last may be smaller).
  std::size_t batches() const;
  // Starts epoch `epoch` (reshuffles); next() then yields its batches.
  void start_epoch(int epoch);
  // The next batch of the epoch, or nullopt at its end.
  std::optional<Batch> next();

 private:
  Batch build(std::size_t batch_index) const;
  void prefetch(std::size_t batch_index);
  void join();

  std::shared_ptr<const Dataset> dataset_;
  std::vector<std::size_t> indices_;
  std::vector<std::size_t> order_;
  int64_t batch_size_;
  std::optional<std::uint64_t> shuffle_seed_;
  std::size_t cursor_ = 0;
  std::thread worker_;
  bool drop_last_;
  int threads_;
  std::optional<Batch> ready_;
  std::exception_ptr failure_;
};

// Indices [0, n) split into training and validation (the last `validation_share` of them).
std::pair<std::vector<std::size_t>, std::vector<std::size_t>> split_indices(
    std::size_t n, double validation_share);

}  // namespace ferry::data
