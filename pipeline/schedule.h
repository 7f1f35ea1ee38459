// The order in which the master lets a step's micro-batches through the stages: which forwards go
// in when the step starts, which backwards an output lets go, which forward a finished backward
// lets in. One small type per schedule (see ferry/pipeline/pipeline.h for what each costs).
// Private to pipeline/.
//
// Thread rules: not thread-safe; one step's driver owns one.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "ferry/pipeline/pipeline.h"

namespace ferry::pipeline {

class MicrobatchSchedule {
 public:
  virtual ~MicrobatchSchedule() = default;
  // The forwards to send when the step starts, in order.
  virtual std::vector<int> start() = 0;
  // Micro-batch `m`'s output reached the master: the backwards to send now, in order.
  virtual std::vector<int> on_output(int m) = 0;
  // A micro-batch's backward finished: the forward to send now, if any.
  virtual std::optional<int> on_backward_done() = 0;
};

// GPipe: every forward at once; every backward once the last output is in.
class GPipeSchedule final : public MicrobatchSchedule {
 public:
  explicit GPipeSchedule(int microbatches) : microbatches_(microbatches) {}
  std::vector<int> start() override;
  std::vector<int> on_output(int m) override;
  std::optional<int> on_backward_done() override { return std::nullopt; }

 private:
  int microbatches_;
  int outputs_ = 0;
};

// 1F1B: at most one micro-batch per stage in flight; each output's backward goes at once, and
// each finished backward lets the next forward in.
class OneFOneBSchedule final : public MicrobatchSchedule {
 public:
  OneFOneBSchedule(int stages, int microbatches) : stages_(stages), microbatches_(microbatches) {}
  std::vector<int> start() override;
  std::vector<int> on_output(int m) override { return {m}; }
  std::optional<int> on_backward_done() override;

 private:
  int stages_;
  int microbatches_;
  int forwards_sent_ = 0;
};

std::unique_ptr<MicrobatchSchedule> make_schedule(Schedule schedule, int stages, int microbatches);

}  // namespace ferry::pipeline
