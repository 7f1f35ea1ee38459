#include "data/mask_ids.h"

#include <fmt/format.h>
#include <png.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <stdexcept>
#include <vector>

#include "ferry/core/fail.h"

namespace ferry::data {
namespace {

using core::fail;

std::string extension_of(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
  return ext;
}

// A PNG whose header says colour type 3: its pixels are indices into a palette.
bool is_palette_png(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!file) return false;
  unsigned char header[26];
  if (std::fread(header, 1, sizeof header, file.get()) != sizeof header) return false;
  return png_sig_cmp(header, 0, 8) == 0 && header[25] == PNG_COLOR_TYPE_PALETTE;
}

// The palette indices of a palette PNG, CV_8U. OpenCV would turn them into the palette's colours.
cv::Mat palette_indices(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!file) fail(fmt::format("data folder: cannot open \"{}\"", path));
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  cv::Mat out;
  std::vector<png_bytep> rows;
  // Everything that libpng's error jump may skip is made before it.
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    fail(fmt::format("data folder: cannot read \"{}\" as a palette PNG", path));
  }
  png_init_io(png, file.get());
  png_read_info(png, info);
  if (png_get_bit_depth(png, info) < 8) png_set_packing(png);  // one index a byte
  png_read_update_info(png, info);
  out.create(static_cast<int>(png_get_image_height(png, info)),
             static_cast<int>(png_get_image_width(png, info)), CV_8UC1);
  rows.resize(static_cast<std::size_t>(out.rows));
  for (int y = 0; y < out.rows; ++y) rows[static_cast<std::size_t>(y)] = out.ptr<png_byte>(y);
  png_read_image(png, rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return out;
}

cv::Mat read_unchanged(const std::string& path) {
  cv::Mat m;
  try {
    m = cv::imread(path, cv::IMREAD_UNCHANGED);
  } catch (const cv::Exception& e) {
    fail(fmt::format("data folder: cannot read \"{}\": {}", path, e.what()));
  }
  if (m.empty()) fail(fmt::format("data folder: cannot read \"{}\" as an image", path));
  return m;
}

// The first pixel for which `bad` holds, as "the value V at x X, y Y".
template <typename Bad>
std::string first_bad(const cv::Mat& ids, Bad bad) {
  for (int y = 0; y < ids.rows; ++y) {
    const int* row = ids.ptr<int>(y);
    for (int x = 0; x < ids.cols; ++x) {
      if (bad(row[x])) return fmt::format("the value {} at x {}, y {}", row[x], x, y);
    }
  }
  return "";
}

std::string ignore_clause(const MaskLabels& labels) {
  return labels.ignore_index ? fmt::format(" nor the --ignore-index {}", *labels.ignore_index) : "";
}

// One class: 0 and 1, or 0 and 255 (then read as 1), besides the ignore index.
void check_binary(cv::Mat& ids, const std::string& path, const MaskLabels& labels) {
  auto ignored = [&](int v) { return labels.ignore_index && v == *labels.ignore_index; };
  const std::string other =
      first_bad(ids, [&](int v) { return v != 0 && v != 1 && v != 255 && !ignored(v); });
  if (!other.empty()) {
    fail(
        fmt::format("mask \"{}\" holds {}: with --classes 1 a mask holds 0 and 1 (or 0 and "
                    "255){}; masks of class ids need --classes K",
                    path, other, ignore_clause(labels)));
  }
  const bool ones = !first_bad(ids, [&](int v) { return v == 1 && !ignored(v); }).empty();
  const std::string full = first_bad(ids, [&](int v) { return v == 255 && !ignored(v); });
  if (ones && !full.empty()) {
    fail(
        fmt::format("mask \"{}\" holds both 1 and 255 ({}): with --classes 1 a mask is of 0 "
                    "and 1 or of 0 and 255",
                    path, full));
  }
  if (!full.empty()) ids.setTo(1, ids == 255);
}

void check_classes(const cv::Mat& ids, const std::string& path, const MaskLabels& labels) {
  const std::string bad = first_bad(ids, [&](int v) {
    return (v < 0 || v >= labels.classes) && !(labels.ignore_index && v == *labels.ignore_index);
  });
  if (bad.empty()) return;
  fail(fmt::format("mask \"{}\" holds {}, not a class id below --classes {}{}", path, bad,
                   labels.classes, ignore_clause(labels)));
}

}  // namespace

cv::Mat read_mask_ids(const std::string& path, const MaskLabels& labels) {
  const std::string ext = extension_of(path);
  const bool jpeg = ext == ".jpg" || ext == ".jpeg";
  if (jpeg && labels.classes > 1) {
    fail(
        fmt::format("mask \"{}\" is a JPEG, whose compression changes class ids; save masks of "
                    "classes as PNG",
                    path));
  }
  cv::Mat raw = is_palette_png(path) ? palette_indices(path) : read_unchanged(path);
  if (raw.channels() > 1) {
    if (labels.classes > 1) {
      fail(
          fmt::format("mask \"{}\" is a colour image: class ids are read from grey levels (8 or "
                      "16 bits) or a palette's indices",
                      path));
    }
    cv::cvtColor(raw, raw, raw.channels() == 4 ? cv::COLOR_BGRA2GRAY : cv::COLOR_BGR2GRAY);
  }
  if (raw.depth() != CV_8U && raw.depth() != CV_16U) {
    fail(fmt::format("mask \"{}\" has pixels of neither 8 nor 16 bits", path));
  }
  if (jpeg) {
    double low, high;
    cv::minMaxLoc(raw, &low, &high);
    cv::Mat foreground = raw > (high > 1 ? 127 : 0);
    foreground.convertTo(raw, CV_32S, 1.0 / 255);
    return raw;
  }
  cv::Mat ids;
  raw.convertTo(ids, CV_32S);
  if (labels.classes > 1) {
    check_classes(ids, path, labels);
  } else {
    check_binary(ids, path, labels);
  }
  return ids;
}

}  // namespace ferry::data
