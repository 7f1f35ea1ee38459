#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "data/mask_ids.h"
#include "data/resize.h"
#include "ferry/core/fail.h"
#include "ferry/core/files.h"
#include "ferry/core/log.h"
#include "ferry/core/text.h"
#include "ferry/data/dataset.h"

namespace ferry::data {
namespace {

namespace fs = std::filesystem;

using core::fail;

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

cv::Mat read(const std::string& path, int flags) {
  cv::Mat m;
  try {
    m = cv::imread(path, flags);
  } catch (const cv::Exception& e) {
    fail(fmt::format("data folder: cannot read \"{}\": {}", path, e.what()));
  }
  if (m.empty()) fail(fmt::format("data folder: cannot read \"{}\" as an image", path));
  return m;
}

// An image file as 8-bit BGR, whatever it holds: grey levels or an alpha channel (said once per
// data set, through `said`, with the first file that has them), 16-bit channels.
cv::Mat colour_image(const std::string& path, std::atomic<bool>& said) {
  cv::Mat image = read(path, cv::IMREAD_UNCHANGED);
  if (image.depth() == CV_16U) image.convertTo(image, CV_8U, 1.0 / 257);
  if (image.depth() != CV_8U) {
    fail(fmt::format("data folder: \"{}\" has pixels of neither 8 nor 16 bits", path));
  }
  if (image.channels() == 3) return image;
  if (!said.exchange(true)) {
    log::warn("data folder: \"{}\" is {}: read as RGB (said for its first file only)", path,
              image.channels() == 4 ? "RGBA (its alpha left out)" : "grey");
  }
  cv::cvtColor(image, image, image.channels() == 4 ? cv::COLOR_BGRA2BGR : cv::COLOR_GRAY2BGR);
  return image;
}

// An RGB image of 8-bit channels as [3, H, W] floats in [0, 1].
at::Tensor pixels_of(const cv::Mat& rgb) {
  at::Tensor pixels = torch::from_blob(rgb.data, {rgb.rows, rgb.cols, 3}, at::kByte);
  return pixels.permute({2, 0, 1}).to(at::kFloat).div_(255.0).contiguous();
}

// Mask ids (CV_32S, continuous) as Sample's masks hold them: float with one class, else int64.
at::Tensor mask_tensor_of(const cv::Mat& ids, const MaskLabels& labels) {
  at::Tensor values = torch::from_blob(ids.data, {ids.rows, ids.cols}, at::kInt);
  return values.to(labels.classes > 1 ? at::kLong : at::kFloat);
}

// Encoded in memory, then written atomically: a file on disk is whole or absent.
void write_image(const cv::Mat& image, const std::string& path, const char* what) {
  std::vector<uchar> encoded;
  bool done = false;
  try {
    done = cv::imencode(fs::path(path).extension().string(), image, encoded);
  } catch (const cv::Exception& e) {
    fail(fmt::format("cannot write {} \"{}\": {}", what, path, e.what()));
  }
  if (!done) {
    fail(fmt::format("cannot write {} \"{}\": no image format for its extension", what, path));
  }
  try {
    core::write_file_atomically(
        path, std::string_view(reinterpret_cast<const char*>(encoded.data()), encoded.size()));
  } catch (const std::runtime_error& e) {
    fail(fmt::format("cannot write {} \"{}\": {}", what, path, e.what()));
  }
}

// Pascal VOC's colour of class `id` (its bits spread over the channels), as BGR.
cv::Vec3b class_colour(int id) {
  int r = 0, g = 0, b = 0;
  for (int shift = 7; id > 0 && shift >= 0; --shift, id >>= 3) {
    r |= (id & 1) << shift;
    g |= ((id >> 1) & 1) << shift;
    b |= ((id >> 2) & 1) << shift;
  }
  return {static_cast<uchar>(b), static_cast<uchar>(g), static_cast<uchar>(r)};
}

}  // namespace

std::map<std::string, std::string> image_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail(fmt::format("data folder: \"{}\" is not a folder", dir));
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file() || !is_image_file(entry.path())) continue;
    auto [it, fresh] = out.emplace(entry.path().stem().string(), entry.path().string());
    if (!fresh) {
      fail(fmt::format("data folder: \"{}\" and \"{}\" have the same name", it->second,
                       entry.path().string()));
    }
  }
  return out;
}

ImageFile read_image(const std::string& path, const core::ImageSize& image_size, Resize resize) {
  cv::Mat image = read(path, cv::IMREAD_COLOR);
  ImageFile out{
      {}, image.rows, image.cols, box_in_frame(image.rows, image.cols, image_size, resize)};
  cv::Mat no_mask;
  fit(image, no_mask, image_size, resize, 0);
  cv::cvtColor(image, image, cv::COLOR_BGR2RGB);
  out.pixels = pixels_of(image);
  return out;
}

at::Tensor read_mask(const std::string& path, const MaskLabels& labels) {
  return mask_tensor_of(read_mask_ids(path, labels), labels);
}

void write_mask(const at::Tensor& mask, const std::string& path) {
  const int rows = static_cast<int>(mask.size(0)), cols = static_cast<int>(mask.size(1));
  at::Tensor pixels;
  cv::Mat image;
  if (at::isFloatingType(mask.scalar_type()) || mask.scalar_type() == at::kBool) {
    pixels = mask.gt(0).to(at::kByte).mul(255).contiguous();
    image = cv::Mat(rows, cols, CV_8UC1, pixels.data_ptr());
  } else if (mask.numel() == 0 || mask.max().item<int64_t>() < 256) {
    pixels = mask.to(at::kByte).contiguous();
    image = cv::Mat(rows, cols, CV_8UC1, pixels.data_ptr());
  } else {
    pixels = mask.clamp(0, 65535).to(at::kInt).contiguous();
    cv::Mat(rows, cols, CV_32SC1, pixels.data_ptr()).convertTo(image, CV_16U);
  }
  write_image(image, path, "mask");
}

void write_overlay(const std::string& image_path, const at::Tensor& mask, const std::string& path) {
  cv::Mat image = read(image_path, cv::IMREAD_COLOR);
  if (image.rows != mask.size(0) || image.cols != mask.size(1)) {
    fail(fmt::format("cannot write overlay \"{}\": the mask is {}x{}, its image \"{}\" {}x{}", path,
                     mask.size(1), mask.size(0), image_path, image.cols, image.rows));
  }
  const at::Tensor ids =
      (at::isFloatingType(mask.scalar_type()) ? mask.gt(0) : mask).to(at::kInt).contiguous();
  const int* id = ids.data_ptr<int>();
  for (int y = 0; y < image.rows; ++y) {
    auto* row = image.ptr<cv::Vec3b>(y);
    for (int x = 0; x < image.cols; ++x, ++id) {
      if (*id <= 0) continue;  // the background shows as it is
      const cv::Vec3b colour = class_colour(*id);
      for (int c = 0; c < 3; ++c) row[x][c] = static_cast<uchar>((row[x][c] + colour[c]) / 2);
    }
  }
  write_image(image, path, "overlay");
}

Augmentation Augmentation::parse(const std::string& text) {
  Augmentation a;
  if (text == "none") return a;
  for (const std::string& word : core::split(text, ',')) {
    if (word == "flip") {
      a.flip = true;
    } else if (word == "rot90") {
      a.rot90 = true;
    } else if (word == "scale") {
      a.scale = true;
    } else if (word == "color") {
      a.color = true;
    } else {
      fail(fmt::format("--augment \"{}\": \"{}\" is none of flip, rot90, scale, color (or none)",
                       text, word));
    }
  }
  return a;
}

FolderDataset::FolderDataset(const std::string& dir, Options options) : options_(options) {
  if (options_.image_size.height < 1 || options_.image_size.width < 1) {
    fail("data folder: the image size must be positive");
  }
  auto images = image_files((fs::path(dir) / "images").string());
  auto masks = image_files((fs::path(dir) / "masks").string());
  if (images.empty()) fail(fmt::format("data folder: no PNG or JPEG files in \"{}/images\"", dir));
  for (const auto& [name, path] : images) {
    auto mask = masks.find(name);
    if (mask == masks.end()) {
      fail(fmt::format("data folder: image \"{}\" has no mask \"{}/masks/{}.png\" (or .jpg)", path,
                       dir, name));
    }
    images_.push_back(path);
    masks_.push_back(mask->second);
  }
}

Sample FolderDataset::get(std::size_t index) const {
  // Apart from the loader's keys, which count up from 0.
  return get_drawn(index, (std::uint64_t{1} << 63) + draws_.fetch_add(1));
}

Sample FolderDataset::get_drawn(std::size_t index, std::uint64_t draw) const {
  const std::string& image_path = images_.at(index);
  const std::string& mask_path = masks_.at(index);
  cv::Mat image = colour_image(image_path, said_converted_);
  cv::Mat mask = read_mask_ids(mask_path, options_.labels);
  if (image.size() != mask.size()) {
    fail(fmt::format("data folder: mask \"{}\" is {}x{} but its image \"{}\" is {}x{}", mask_path,
                     mask.cols, mask.rows, image_path, image.cols, image.rows));
  }

  const core::ImageSize& size = options_.image_size;
  const int height = static_cast<int>(size.height), width = static_cast<int>(size.width);
  const Augmentation& augment = options_.augment;
  std::seed_seq seeds{options_.seed, static_cast<std::uint64_t>(index), draw};
  std::mt19937_64 rng(seeds);
  if (augment.scale) {
    // The largest part of the size's aspect the image holds, then a quarter to all of its area,
    // anywhere in the image.
    const double aspect = static_cast<double>(width) / height;
    const double widest = std::min<double>(image.cols, image.rows * aspect);
    const double area = std::uniform_real_distribution<double>(0.25, 1.0)(rng);
    const int w = std::max(1, static_cast<int>(std::lround(widest * std::sqrt(area))));
    const int h = std::clamp(static_cast<int>(std::lround(w / aspect)), 1, image.rows);
    const int x = std::uniform_int_distribution<int>(0, image.cols - w)(rng);
    const int y = std::uniform_int_distribution<int>(0, image.rows - h)(rng);
    image = image(cv::Rect(x, y, w, h)).clone();
    mask = mask(cv::Rect(x, y, w, h)).clone();
  } else if (options_.crop) {
    if (image.cols < width || image.rows < height) {
      fail(fmt::format("data folder: \"{}\" is {}x{}, smaller than the {}x{} crop", image_path,
                       image.cols, image.rows, width, height));
    }
    int x = (image.cols - width) / 2, y = (image.rows - height) / 2;
    if (augment.any()) {
      x = std::uniform_int_distribution<int>(0, image.cols - width)(rng);
      y = std::uniform_int_distribution<int>(0, image.rows - height)(rng);
    }
    cv::Rect box(x, y, width, height);
    image = image(box).clone();
    mask = mask(box).clone();
  }
  fit(image, mask, size, options_.resize,
      static_cast<int>(options_.labels.ignore_index.value_or(0)));
  if (augment.flip) {
    std::bernoulli_distribution coin(0.5);
    bool horizontal = coin(rng), vertical = coin(rng);
    int code = horizontal && vertical ? -1 : horizontal ? 1 : 0;
    if (horizontal || vertical) {
      cv::flip(image, image, code);
      cv::flip(mask, mask, code);
    }
  }
  if (augment.rot90) {
    // A quarter turn would swap the sides of a size that is not square.
    const int turns = size.square() ? std::uniform_int_distribution<int>(0, 3)(rng)
                                    : 2 * std::uniform_int_distribution<int>(0, 1)(rng);
    if (turns > 0) {
      const int code = turns == 1   ? cv::ROTATE_90_CLOCKWISE
                       : turns == 2 ? cv::ROTATE_180
                                    : cv::ROTATE_90_COUNTERCLOCKWISE;
      cv::rotate(image, image, code);
      cv::rotate(mask, mask, code);
    }
  }
  if (augment.color) {
    // Contrast about the image's mean grey, then brightness, as torchvision's ColorJitter.
    std::uniform_real_distribution<double> factor(0.8, 1.2);
    const double contrast = factor(rng), brightness = factor(rng);
    const cv::Scalar mean = cv::mean(image);
    const double grey = (mean[0] + mean[1] + mean[2]) / 3;
    image.convertTo(image, CV_8U, contrast * brightness, (1 - contrast) * grey * brightness);
  }
  cv::cvtColor(image, image, cv::COLOR_BGR2RGB);
  return {pixels_of(image), mask_tensor_of(mask, options_.labels).unsqueeze(0)};
}

}  // namespace ferry::data
