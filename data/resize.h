// Images and masks brought to the size the model takes, as `--resize` says. Safe from any thread.
#pragma once

#include <opencv2/core.hpp>

#include "ferry/data/dataset.h"

namespace ferry::data {

// `image` (8-bit BGR) and, when not empty, its `mask` (CV_32S ids, the image's size) at `size`:
// scaled as `box_in_frame` places them (the image by area, the mask by nearest neighbour), the
// frame around a padded image black and around its mask `mask_fill`.
void fit(cv::Mat& image, cv::Mat& mask, const core::ImageSize& size, Resize resize, int mask_fill);

}  // namespace ferry::data
