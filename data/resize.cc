#include "data/resize.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <opencv2/imgproc.hpp>
#include <stdexcept>

namespace ferry::data {

Resize parse_resize(const std::string& text) {
  if (text == "stretch") return Resize::stretch;
  if (text == "pad") return Resize::pad;
  if (text == "crop") return Resize::crop;
  throw std::invalid_argument(fmt::format("--resize \"{}\" is none of stretch, pad, crop", text));
}

const char* resize_name(Resize resize) {
  switch (resize) {
    case Resize::stretch:
      return "stretch";
    case Resize::pad:
      return "pad";
    case Resize::crop:
      return "crop";
  }
  return "pad";
}

Box box_in_frame(int64_t height, int64_t width, const core::ImageSize& frame, Resize resize) {
  if (resize == Resize::stretch || height < 1 || width < 1) {
    return {0, 0, frame.width, frame.height};
  }
  const double down = static_cast<double>(frame.height) / static_cast<double>(height);
  const double across = static_cast<double>(frame.width) / static_cast<double>(width);
  const double scale = resize == Resize::pad ? std::min(down, across) : std::max(down, across);
  // At least the frame's side along the axis the scale was chosen by, so rounding leaves no gap.
  const int64_t h = std::max<int64_t>(1, std::llround(static_cast<double>(height) * scale));
  const int64_t w = std::max<int64_t>(1, std::llround(static_cast<double>(width) * scale));
  const int64_t box_h =
      resize == Resize::pad ? std::min(h, frame.height) : std::max(h, frame.height);
  const int64_t box_w = resize == Resize::pad ? std::min(w, frame.width) : std::max(w, frame.width);
  return {(frame.width - box_w) / 2, (frame.height - box_h) / 2, box_w, box_h};
}

void fit(cv::Mat& image, cv::Mat& mask, const core::ImageSize& size, Resize resize, int mask_fill) {
  const Box box = box_in_frame(image.rows, image.cols, size, resize);
  const cv::Size scaled(static_cast<int>(box.width), static_cast<int>(box.height));
  if (image.size() != scaled) {
    cv::resize(image, image, scaled, 0, 0, cv::INTER_AREA);
    if (!mask.empty()) cv::resize(mask, mask, scaled, 0, 0, cv::INTER_NEAREST);
  }
  const int top = static_cast<int>(box.y), left = static_cast<int>(box.x);
  const int bottom = static_cast<int>(size.height - box.y - box.height);
  const int right = static_cast<int>(size.width - box.x - box.width);
  if (top > 0 || left > 0 || bottom > 0 || right > 0) {  // padded (a crop's are all <= 0)
    cv::copyMakeBorder(image, image, top, bottom, left, right, cv::BORDER_CONSTANT, cv::Scalar());
    if (!mask.empty()) {
      cv::copyMakeBorder(mask, mask, top, bottom, left, right, cv::BORDER_CONSTANT,
                         cv::Scalar(mask_fill));
    }
  } else if (top < 0 || left < 0 || bottom < 0 || right < 0) {
    const cv::Rect middle(-left, -top, static_cast<int>(size.width), static_cast<int>(size.height));
    image = image(middle).clone();
    if (!mask.empty()) mask = mask(middle).clone();
  }
}

}  // namespace ferry::data
