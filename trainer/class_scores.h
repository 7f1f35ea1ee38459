// Validation's per-class figures: the pixels of each class predicted right and wrong, summed over
// batches (and replicas), and the IoU and Dice of each class and their means. With one class the
// logits say foreground where above 0 and the classes are background and foreground; with K > 1
// the class of a pixel is its largest logit. Value type; no thread rules.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace ferry::trainer {

// IoU and Dice of each class (NaN where a class is in neither the masks nor the predictions),
// and the means the run reports: `iou` and `dice` of the foreground (one class) or their mean
// over the foreground classes; `miou`, the mean IoU over every class, background included, as
// Pascal VOC scores it. A mean over no defined class is 1: nothing to find, nothing found.
struct ClassScores {
  std::vector<double> iou, dice;
  double mean_iou = 1, mean_dice = 1, miou = 1;
};

class ClassCounts {
 public:
  // `classes` as the head's channels: 1 (binary) or K > 1.
  ClassCounts(std::int64_t classes, std::optional<std::int64_t> ignore_index);

  // Counts the pixels of logits [B, K, H, W] against masks [B, 1, H, W] (as data::Sample's).
  void add(const at::Tensor& logits, const at::Tensor& masks);
  void add(const ClassCounts& other);
  ClassScores scores() const;

 private:
  std::int64_t classes_;  // counted: 2 for a binary head
  std::optional<std::int64_t> ignore_index_;
  std::vector<double> confusion_;  // [truth * classes_ + predicted]
};

}  // namespace ferry::trainer
