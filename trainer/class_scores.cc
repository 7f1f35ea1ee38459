#include "trainer/class_scores.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace ferry::trainer {
namespace {

// The mean of the defined (not NaN) values from `first` on; 1 if there is none.
double defined_mean(const std::vector<double>& values, std::size_t first) {
  double sum = 0;
  int count = 0;
  for (std::size_t k = first; k < values.size(); ++k) {
    if (std::isnan(values[k])) continue;
    sum += values[k];
    ++count;
  }
  return count ? sum / count : 1;
}

}  // namespace

ClassCounts::ClassCounts(std::int64_t classes, std::optional<std::int64_t> ignore_index)
    : classes_(std::max<std::int64_t>(classes, 2)),
      ignore_index_(ignore_index),
      confusion_(static_cast<std::size_t>(classes_ * classes_), 0.0) {}

void ClassCounts::add(const at::Tensor& logits, const at::Tensor& masks) {
  const at::Tensor predicted =
      logits.size(1) == 1 ? logits.gt(0).to(torch::kLong) : logits.argmax(1, /*keepdim=*/true);
  at::Tensor truth = masks.to(torch::kLong).reshape(-1);
  at::Tensor guess = predicted.reshape(-1);
  if (ignore_index_) {
    const at::Tensor keep = truth.ne(*ignore_index_);
    truth = truth.masked_select(keep);
    guess = guess.masked_select(keep);
  }
  const at::Tensor counts = torch::bincount(truth * classes_ + guess, {}, classes_ * classes_);
  const at::Tensor as_double = counts.to(torch::kDouble).contiguous();
  const double* data = as_double.data_ptr<double>();
  for (std::size_t k = 0; k < confusion_.size(); ++k) confusion_[k] += data[k];
}

void ClassCounts::add(const ClassCounts& other) {
  for (std::size_t k = 0; k < confusion_.size(); ++k) confusion_[k] += other.confusion_[k];
}

ClassScores ClassCounts::scores() const {
  const auto n = static_cast<std::size_t>(classes_);
  ClassScores out;
  for (std::size_t c = 0; c < n; ++c) {
    double truth = 0, predicted = 0;
    for (std::size_t k = 0; k < n; ++k) {
      truth += confusion_[c * n + k];
      predicted += confusion_[k * n + c];
    }
    const double hit = confusion_[c * n + c];
    const double either = truth + predicted - hit;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    out.iou.push_back(either > 0 ? hit / either : nan);
    out.dice.push_back(either > 0 ? 2 * hit / (truth + predicted) : nan);
  }
  out.mean_iou = defined_mean(out.iou, 1);
  out.mean_dice = defined_mean(out.dice, 1);
  out.miou = defined_mean(out.iou, 0);
  return out;
}

}  // namespace ferry::trainer
