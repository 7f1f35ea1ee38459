// Masks as Pascal VOC ships them: palette PNGs whose pixels are class ids. OpenCV writes no
// palette PNG (and reads one as its colours), so tests write them with libpng.
#pragma once

#include <opencv2/core.hpp>
#include <string>

namespace ferry::testing {

// Writes `ids` (CV_8U) as a palette PNG of 256 colours, none of them a grey level equal to its
// index. Throws std::runtime_error naming the file when it cannot be written.
void write_palette_png(const std::string& path, const cv::Mat& ids);

}  // namespace ferry::testing
