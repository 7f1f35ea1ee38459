#include "pipeline/schedule.h"

#include <algorithm>
#include <numeric>

namespace ferry::pipeline {
namespace {

std::vector<int> first(int count) {
  std::vector<int> out(static_cast<size_t>(std::max(count, 0)));
  std::iota(out.begin(), out.end(), 0);
  return out;
}

}  // namespace

std::vector<int> GPipeSchedule::start() { return first(microbatches_); }

std::vector<int> GPipeSchedule::on_output(int) {
  return ++outputs_ == microbatches_ ? first(microbatches_) : std::vector<int>{};
}

std::vector<int> OneFOneBSchedule::start() {
  forwards_sent_ = std::min(stages_, microbatches_);
  return first(forwards_sent_);
}

std::optional<int> OneFOneBSchedule::on_backward_done() {
  if (forwards_sent_ >= microbatches_) return std::nullopt;
  return forwards_sent_++;
}

std::unique_ptr<MicrobatchSchedule> make_schedule(Schedule schedule, int stages, int microbatches) {
  // The zero-bubble schedule lets micro-batches in as 1F1B does; its stages defer weight passes.
  if (schedule == Schedule::OneFOneB || schedule == Schedule::ZeroBubble) {
    return std::make_unique<OneFOneBSchedule>(stages, microbatches);
  }
  return std::make_unique<GPipeSchedule>(microbatches);
}

}  // namespace ferry::pipeline
