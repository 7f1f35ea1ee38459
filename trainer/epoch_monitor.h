// The best epoch of a run by one validation metric, and when to stop for lack of progress: what
// Lightning's ModelCheckpoint(monitor=..., save_top_k=1) and EarlyStopping(monitor, patience)
// keep. Value type; no thread rules. Its state goes into checkpoints, so a resumed run keeps its
// best epoch and its count of epochs without improvement.
#pragma once

#include <string>

#include "ferry/trainer/settings.h"

namespace ferry::trainer {

class EpochMonitor {
 public:
  // With `patience` P > 0, observe() says stop after P epochs in a row without improvement of
  // `metric`; 0 never stops. A patience below 0 is rpc::Error(InvalidArgument).
  EpochMonitor(Monitor metric, int patience);

  struct Verdict {
    bool improved = false;  // this epoch is the best so far (the first always is)
    bool stop = false;      // patience ran out
  };
  Verdict observe(int epoch, double value);

  // Puts back what a checkpoint saved; best_epoch 0 means none yet.
  void restore(int best_epoch, double best_value, int stale_epochs);

  Monitor metric() const { return metric_; }
  std::string metric_name() const { return core::name_of(monitor_names(), metric_); }
  int patience() const { return patience_; }
  int best_epoch() const { return best_epoch_; }  // 0 before the first observe()
  double best_value() const { return best_value_; }
  int stale_epochs() const { return stale_epochs_; }

 private:
  Monitor metric_;
  int patience_;
  int best_epoch_ = 0;
  double best_value_ = 0;
  int stale_epochs_ = 0;
};

}  // namespace ferry::trainer
