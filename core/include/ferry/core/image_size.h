// The height and width every image is brought to before a model sees it, as `--image-size` gives
// it. No LibTorch. Value type.
#pragma once

#include <cstdint>
#include <string>

namespace ferry::core {

struct ImageSize {
  int64_t height = 0, width = 0;

  ImageSize() = default;
  // A square of `side`, as `--image-size 256` says; implicit, so a side reads as a size.
  ImageSize(int64_t side) : height(side), width(side) {}  // NOLINT(google-explicit-constructor)
  ImageSize(int64_t height_, int64_t width_) : height(height_), width(width_) {}

  bool square() const { return height == width; }
  int64_t pixels() const { return height * width; }
  // "256" for a square, else "256,320" (height, then width), as parse reads it.
  std::string text() const;
  // "192 x 320": height by width, as messages and tables print it.
  std::string extent() const;
  // "S" or "H,W" of positive whole numbers. Throws std::invalid_argument quoting the text.
  static ImageSize parse(const std::string& text);

  friend bool operator==(const ImageSize& a, const ImageSize& b) {
    return a.height == b.height && a.width == b.width;
  }
  friend bool operator!=(const ImageSize& a, const ImageSize& b) { return !(a == b); }
};

}  // namespace ferry::core
