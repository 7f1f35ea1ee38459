// Learning-rate schedules over optimizer steps (as torch.optim.lr_scheduler's StepLR,
// CosineAnnealingLR and OneCycleLR, with a linear warm-up). A schedule is a pure function of the
// step, so a run resumed from a checkpoint that saved the step count follows the same curve.
// Value type; no thread rules.
#pragma once

#include <cstdint>
#include <string>

#include "ferry/core/enum_names.h"

namespace ferry::dist_autograd {

struct LrSchedule {
  enum class Kind { Constant, Step, Cosine, OneCycle };

  Kind kind = Kind::Constant;
  double base_lr = 0.01;
  std::int64_t total_steps = 1;  // optimizer steps of the whole run
  // Constant, Step, Cosine: the rate rises linearly to base_lr over these first steps.
  // OneCycle: the rise (a half cosine from base_lr / 25). Given as -1 to parse(): none, or 30%
  // of the run for OneCycle, as PyTorch's pct_start.
  std::int64_t warmup_steps = 0;
  std::int64_t step_size = 0;  // Step: the rate is multiplied by `gamma` every step_size steps
  double gamma = 0.1;

  // "constant", "step", "cosine", "onecycle".
  static const core::EnumNames<Kind>& kind_names();

  // Throws std::invalid_argument for a setting out of range (no steps, a warm-up as long as the
  // run, ...).
  static LrSchedule of(Kind kind, double base_lr, std::int64_t total_steps,
                       std::int64_t warmup_steps, std::int64_t step_size, double gamma);

  // The rate of optimizer step `step` (0 is the first).
  double lr_at(std::int64_t step) const;
  // "cosine from 0.01 over 120 steps, 10 warm-up": what a log line or a checkpoint says.
  std::string describe() const;
};

}  // namespace ferry::dist_autograd
