#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "ferry/core/files.h"
#include "ferry/data/dataset.h"

namespace ferry::data {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument(message); }

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

// Masks saved as 0/1 have a range of 1; as 0/255, of 255.
cv::Mat foreground_of(const cv::Mat& mask) {
  double low, high;
  cv::minMaxLoc(mask, &low, &high);
  return mask > (high > 1 ? 127 : 0);
}

// An RGB image of 8-bit channels as [3, H, W] floats in [0, 1].
at::Tensor pixels_of(const cv::Mat& rgb) {
  at::Tensor pixels = torch::from_blob(rgb.data, {rgb.rows, rgb.cols, 3}, at::kByte);
  return pixels.permute({2, 0, 1}).to(at::kFloat).div_(255.0).contiguous();
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

ImageFile read_image(const std::string& path, int64_t image_size) {
  cv::Mat image = read(path, cv::IMREAD_COLOR);
  ImageFile out{{}, image.rows, image.cols};
  const int size = static_cast<int>(image_size);
  if (image.cols != size || image.rows != size) {
    cv::resize(image, image, {size, size}, 0, 0, cv::INTER_AREA);
  }
  cv::cvtColor(image, image, cv::COLOR_BGR2RGB);
  out.pixels = pixels_of(image);
  return out;
}

at::Tensor read_mask(const std::string& path) {
  cv::Mat foreground = foreground_of(read(path, cv::IMREAD_GRAYSCALE));
  return torch::from_blob(foreground.data, {foreground.rows, foreground.cols}, at::kByte)
      .gt(0)
      .to(at::kFloat);
}

void write_mask(const at::Tensor& mask, const std::string& path) {
  at::Tensor bytes = mask.gt(0).to(at::kByte).mul(255).contiguous();
  cv::Mat image(static_cast<int>(bytes.size(0)), static_cast<int>(bytes.size(1)), CV_8UC1,
                bytes.data_ptr());
  // Encoded in memory, then written atomically: a mask on disk is whole or absent.
  std::vector<uchar> encoded;
  bool done = false;
  try {
    done = cv::imencode(fs::path(path).extension().string(), image, encoded);
  } catch (const cv::Exception& e) {
    fail(fmt::format("cannot write mask \"{}\": {}", path, e.what()));
  }
  if (!done) fail(fmt::format("cannot write mask \"{}\": no image format for its extension", path));
  try {
    core::write_file_atomically(
        path, std::string_view(reinterpret_cast<const char*>(encoded.data()), encoded.size()));
  } catch (const std::runtime_error& e) {
    fail(fmt::format("cannot write mask \"{}\": {}", path, e.what()));
  }
}

FolderDataset::FolderDataset(const std::string& dir, Options options) : options_(options) {
  if (options_.image_size < 1) fail("data folder: the image size must be positive");
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
  const std::string& image_path = images_.at(index);
  const std::string& mask_path = masks_.at(index);
  cv::Mat image = read(image_path, cv::IMREAD_COLOR);
  cv::Mat mask = read(mask_path, cv::IMREAD_GRAYSCALE);
  if (image.size() != mask.size()) {
    fail(fmt::format("data folder: mask \"{}\" is {}x{} but its image \"{}\" is {}x{}", mask_path,
                     mask.cols, mask.rows, image_path, image.cols, image.rows));
  }
  cv::Mat foreground = foreground_of(mask);

  int size = static_cast<int>(options_.image_size);
  std::mt19937_64 rng(options_.seed * 0x9E3779B97F4A7C15ULL + index * 1000003ULL +
                      draws_.fetch_add(1));
  if (options_.crop) {
    if (image.cols < size || image.rows < size) {
      fail(fmt::format("data folder: \"{}\" is {}x{}, smaller than the {}x{} crop", image_path,
                       image.cols, image.rows, size, size));
    }
    int x = (image.cols - size) / 2, y = (image.rows - size) / 2;
    if (options_.augment) {
      x = std::uniform_int_distribution<int>(0, image.cols - size)(rng);
      y = std::uniform_int_distribution<int>(0, image.rows - size)(rng);
    }
    cv::Rect box(x, y, size, size);
    image = image(box).clone();
    foreground = foreground(box).clone();
  } else if (image.cols != size || image.rows != size) {
    cv::resize(image, image, {size, size}, 0, 0, cv::INTER_AREA);
    cv::resize(foreground, foreground, {size, size}, 0, 0, cv::INTER_NEAREST);
  }
  if (options_.augment) {
    std::bernoulli_distribution coin(0.5);
    bool horizontal = coin(rng), vertical = coin(rng);
    int code = horizontal && vertical ? -1 : horizontal ? 1 : 0;
    if (horizontal || vertical) {
      cv::flip(image, image, code);
      cv::flip(foreground, foreground, code);
    }
  }
  cv::cvtColor(image, image, cv::COLOR_BGR2RGB);
  at::Tensor fg = torch::from_blob(foreground.data, {1, size, size}, at::kByte);
  return {pixels_of(image), (fg > 0).to(at::kFloat)};
}

}  // namespace ferry::data
