// Masks as their files hold them: grey levels of 8 or 16 bits, or a palette's indices (as
// Pascal VOC ships them), read as one id per pixel and checked against the classes the run trains.
// No LibTorch: the folder data set turns the ids into tensors. Safe from any thread.
#pragma once

#include <opencv2/core.hpp>
#include <string>

#include "ferry/data/dataset.h"

namespace ferry::data {

// The mask file at `path` as CV_32S [H, W]: with one class, 0 and 1 (a file of 0 and 255 reads
// as 0 and 1; a JPEG, whose compression moves values, is thresholded at half its range); with
// K > 1, the class ids. Pixels of the ignore index keep that value. Throws std::invalid_argument
// naming the file, and the value, where it is and the flag, for a value the labels do not allow.
cv::Mat read_mask_ids(const std::string& path, const MaskLabels& labels);

}  // namespace ferry::data
