#include "trainer/epoch_monitor.h"

#include <fmt/format.h>

#include "ferry/rpc/error.h"

namespace ferry::trainer {

EpochMonitor::EpochMonitor(Monitor metric, int patience) : metric_(metric), patience_(patience) {
  if (patience_ < 0) {
    rpc::refuse(fmt::format("--early-stop-patience must be 0 (never) or more, not {}", patience_));
  }
}

EpochMonitor::Verdict EpochMonitor::observe(int epoch, double value) {
  Verdict verdict;
  // The loss is better lower; IoU and Dice higher.
  const bool better = metric_ == Monitor::ValLoss ? value < best_value_ : value > best_value_;
  if (best_epoch_ == 0 || better) {
    best_epoch_ = epoch;
    best_value_ = value;
    stale_epochs_ = 0;
    verdict.improved = true;
    return verdict;
  }
  ++stale_epochs_;
  verdict.stop = patience_ > 0 && stale_epochs_ >= patience_;
  return verdict;
}

void EpochMonitor::restore(int best_epoch, double best_value, int stale_epochs) {
  best_epoch_ = best_epoch;
  best_value_ = best_value;
  stale_epochs_ = stale_epochs;
}

}  // namespace ferry::trainer
