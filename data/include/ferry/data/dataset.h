// Segmentation data: images with their masks, and batches of them prepared on a background thread
// so the stages never wait on data.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ferry/core/image_size.h"

namespace ferry::data {

// How a mask's values read. Value type.
struct MaskLabels {
  // 1: binary masks, of 0 and 1 (or 0 and 255); K > 1: class ids 0 to K - 1.
  int64_t classes = 1;
  // Pixels of this value count in no loss and no metric (VOC's 255 borders).
  std::optional<int64_t> ignore_index;
};

// One image [3, H, W] in [0, 1] and its mask [1, H, W]: of 0 and 1 (float) with one class, of
// class ids (int64) with more; pixels of the ignore index hold it. Value type.
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
  // The sample at `index` as draw `draw` makes it: a dataset that draws at random (augmentation)
  // seeds that draw from `draw` alone, so that the same (index, draw) gives the same sample in any
  // run and on any thread. The loader keys each draw by the epoch and the place in it. A dataset
  // that draws nothing gives get(index).
  virtual Sample get_drawn(std::size_t index, std::uint64_t draw) const {
    (void)draw;
    return get(index);
  }
};

// Filled ellipses and convex polygons on textured noise, with their masks: deterministic from
// (seed, index), so a run needs nothing downloaded and two runs see the same data. With one
// class the mask is their union; with 2 to 4, a class per kind of shape (synthetic_class_names),
// each kind with a texture of its own, a shape drawn later covering those before it. A size that
// is not square is the middle of the square of its longer side.
class SyntheticDataset final : public Dataset {
 public:
  // Throws std::invalid_argument for classes outside 1 to 4.
  SyntheticDataset(std::size_t count, core::ImageSize image_size, std::uint64_t seed,
                   int64_t classes = 1);
  std::size_t size() const override { return count_; }
  Sample get(std::size_t index) const override;

 private:
  Sample get_binary(std::size_t index) const;
  Sample get_classes(std::size_t index) const;

  std::size_t count_;
  core::ImageSize size_;
  int64_t image_size_;  // the side of the square drawn
  std::uint64_t seed_;
  int64_t classes_;
};

// The names of the synthetic set's classes: background, foreground with one class; background,
// ellipse, polygon and ring, as many as `classes`.
std::vector<std::string> synthetic_class_names(int64_t classes);

// What training draws anew for each image, image and mask alike (masks by nearest neighbour).
// Value type.
struct Augmentation {
  bool flip = false;   // horizontally and vertically, each at even odds
  bool rot90 = false;  // by 0, 90, 180 or 270 degrees (0 or 180 to a size that is not square)
  bool scale = false;  // a part of a quarter to all of the image's area, of the size's aspect
  bool color = false;  // brightness and contrast each by up to 20% (the image only)
  bool any() const { return flip || rot90 || scale || color; }
  // "flip,rot90,scale,color", any of them, or "none". Throws std::invalid_argument naming the
  // word that is none of them.
  static Augmentation parse(const std::string& text);
};

// How an image whose shape differs from the size's reaches it.
enum class Resize {
  stretch,  // to the size, each side on its own (the shapes in it distorted)
  pad,      // scaled to fit inside, keeping its aspect, centred; black around it
  crop,     // scaled to cover, keeping its aspect; its middle
};
// "stretch", "pad" or "crop". Throws std::invalid_argument naming the text and the flag.
Resize parse_resize(const std::string& text);
const char* resize_name(Resize resize);

// Where an image lands in the model's frame: its top-left corner and size after scaling (a crop's
// box is larger than the frame and starts left of and above it). Value type.
struct Box {
  int64_t x = 0, y = 0, width = 0, height = 0;
};
// The box of an image of `height` x `width` in `frame` under `resize`.
Box box_in_frame(int64_t height, int64_t width, const core::ImageSize& frame, Resize resize);

// Images and masks from a folder: DIR/images/NAME.{png,jpg,jpeg} with DIR/masks/NAME.* (any of
// those extensions), paired by NAME. Images are read as RGB (a grey or RGBA one converted, and
// said once); masks as read_mask reads them. Each sample comes out at `image_size`: brought to
// it as `resize` says (a padded mask's frame holds the ignore index, or the background), or with
// `crop` cut out of the image (at random when augmented, else from the centre), or with
// `augment.scale` a random part of it of the size's aspect; then augmented as `augment` says.
class FolderDataset final : public Dataset {
 public:
  struct Options {
    core::ImageSize image_size = 256;
    Resize resize = Resize::pad;
    bool crop = false;
    Augmentation augment;
    std::uint64_t seed = 0;
    MaskLabels labels;
  };
  // Lists and pairs the files; throws std::invalid_argument naming the folder or file when
  // a folder is missing or empty, or an image has no mask. Files are read in get(), which throws
  // naming the file that is unreadable, smaller than a crop, or whose mask's size differs.
  FolderDataset(const std::string& dir, Options options);
  std::size_t size() const override { return images_.size(); }
  // Each call draws anew.
  Sample get(std::size_t index) const override;
  Sample get_drawn(std::size_t index, std::uint64_t draw) const override;

 private:
  std::vector<std::string> images_, masks_;
  Options options_;
  mutable std::atomic<std::uint64_t> draws_{0};      // get()'s draws, from 2^63 up
  mutable std::atomic<bool> said_converted_{false};  // a grey or RGBA image was read as RGB
};

// The image files (PNG, JPEG) directly in `dir`, by name (the file's stem). Throws
// std::invalid_argument naming the folder if it is none, or two files of one name.
std::map<std::string, std::string> image_files(const std::string& dir);

// An image file as the model takes it, at `image_size` as FolderDataset brings it there (area
// averaging; RGB in [0, 1], [3, H, W]), with the size it had and where it lies in the frame, so
// that what a model makes of it can be taken back to the file's own size. Throws
// std::invalid_argument naming the file.
struct ImageFile {
  at::Tensor pixels;
  int64_t height = 0, width = 0;
  Box box;
};
ImageFile read_image(const std::string& path, const core::ImageSize& image_size, Resize resize);

// A mask file at its own size as FolderDataset reads it, [H, W]: with one class, of 0 and 1
// (float; a file of 0 and 255 reads as 0 and 1, a JPEG is thresholded at half its range); with
// K > 1, the class ids (int64) of its grey levels (8 or 16 bits) or of its palette's indices (a
// palette PNG). Pixels of the ignore index keep that value. Throws std::invalid_argument naming
// the file, and the value and where it is when the labels do not allow it.
at::Tensor read_mask(const std::string& path, const MaskLabels& labels = {});
// Writes a mask [H, W] in the format the extension of `path` names (PNG for .png): a floating or
// boolean mask of 0 and 1 as a grey image of 0 and 255; an integer mask of class ids as grey levels
// (8 bits, or 16 where an id is above 255). Throws std::invalid_argument naming the file.
void write_mask(const at::Tensor& mask, const std::string& path);
// Writes the image at `image_path` with `mask` ([H, W] of its size: 0 and 1, or class ids)
// coloured over it, half and half, each class in Pascal VOC's colour, the background as it is.
// Throws std::invalid_argument naming the file.
void write_overlay(const std::string& image_path, const at::Tensor& mask, const std::string& path);

// Images as a pretrained encoder expects them: each channel less its mean, over its standard
// deviation, as torchvision's Normalize and segmentation_models_pytorch's preprocessing. Value
// type.
struct Normalization {
  std::array<double, 3> mean{0, 0, 0}, std{1, 1, 1};
  // "imagenet" (mean 0.485,0.456,0.406, std 0.229,0.224,0.225), "none", or "M1,M2,M3/S1,S2,S3".
  // Throws std::invalid_argument naming the text and what is wrong with it.
  static Normalization parse(const std::string& text);
  // "M1,M2,M3/S1,S2,S3", which parse() reads back exactly.
  std::string to_string() const;
  // RGB images [..., 3, H, W] in [0, 1], normalised.
  at::Tensor apply(const at::Tensor& images) const;
  bool operator==(const Normalization& other) const {
    return mean == other.mean && std == other.std;
  }
};

// `dataset` with its images normalised.
std::shared_ptr<const Dataset> normalized(std::shared_ptr<const Dataset> dataset,
                                          const Normalization& normalization);

// A batch: images [B, 3, H, W], masks [B, 1, H, W] (as Sample's).
struct Batch {
  at::Tensor images;
  at::Tensor masks;
};

// Batches of `indices` of `dataset` in order (shuffled per epoch when `shuffle_seed` is set),
// built on a thread of their own up to `prefetch` batches ahead of the one in use, the samples of
// each read by `threads` threads at once. With `drop_last`, a last batch smaller than
// `batch_size` is left out (batch norm cannot train on a batch of one). A sample that fails to
// load fails next() with its error and ends the epoch. Resource type; used by one thread (the
// builder thread is its own).
class BatchLoader {
 public:
  BatchLoader(std::shared_ptr<const Dataset> dataset, std::vector<std::size_t> indices,
              int64_t batch_size, std::optional<std::uint64_t> shuffle_seed, bool drop_last = false,
              int threads = 2, int prefetch = 2);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Batches per epoch (the last may be smaller).
  std::size_t batches() const;
  // Starts epoch `epoch` (reshuffles); next() then yields its batches from batch `first_batch`
  // on, the same ones an epoch started at 0 yields there (its order and each sample's draw depend
  // only on the seed, the epoch and the place): a run resumed mid-epoch sees what it would have.
  void start_epoch(int epoch, std::size_t first_batch = 0);
  // The next batch of the epoch, or nullopt at its end.
  std::optional<Batch> next();
  // Seconds next() has waited for a batch not yet built, since the loader was made.
  double waited_s() const { return waited_s_; }

 private:
  // A built batch, or why it could not be.
  struct Built {
    std::optional<Batch> batch;
    std::exception_ptr failure;
  };
  Batch build(std::size_t batch_index) const;
  void produce(std::size_t first_batch);
  void stop();

  std::shared_ptr<const Dataset> dataset_;
  std::vector<std::size_t> indices_;
  std::vector<std::size_t> order_;  // the epoch's; read by the builder while it runs
  int64_t batch_size_;
  std::optional<std::uint64_t> shuffle_seed_;
  bool drop_last_;
  int threads_;
  std::size_t prefetch_;
  int epoch_ = 0;           // the epoch's; read by the builder while it runs
  std::size_t cursor_ = 0;  // the epoch's next batch next() gives
  double waited_s_ = 0;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Built> ready_;  // under mutex_
  bool stopping_ = false;    // under mutex_
  std::thread builder_;
};

// Indices [0, n) split into training and validation (the last `validation_share` of them).
std::pair<std::vector<std::size_t>, std::vector<std::size_t>> split_indices(
    std::size_t n, double validation_share);

}  // namespace ferry::data
