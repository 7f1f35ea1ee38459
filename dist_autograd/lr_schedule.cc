#include "ferry/dist_autograd/lr_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace ferry::dist_autograd {
namespace {

constexpr double kPi = 3.14159265358979323846;
// OneCycleLR's defaults: it starts at max / 25 and ends at that / 1e4.
constexpr double kOneCycleDiv = 25.0;
constexpr double kOneCycleFinalDiv = 1e4;

// From `from` at t = 0 to `to` at t = 1 along half a cosine.
double cosine_between(double from, double to, double t) {
  t = std::clamp(t, 0.0, 1.0);
  return to + (from - to) * 0.5 * (1 + std::cos(kPi * t));
}

}  // namespace

const core::EnumNames<LrSchedule::Kind>& LrSchedule::kind_names() {
  static const core::EnumNames<Kind> names = {{Kind::Constant, "constant"},
                                              {Kind::Step, "step"},
                                              {Kind::Cosine, "cosine"},
                                              {Kind::OneCycle, "onecycle"}};
  return names;
}

LrSchedule LrSchedule::of(Kind kind, double base_lr, std::int64_t total_steps,
                          std::int64_t warmup_steps, std::int64_t step_size, double gamma) {
  LrSchedule s;
  s.kind = kind;
  const std::string name = core::name_of(kind_names(), kind);
  if (!(base_lr > 0)) {
    throw std::invalid_argument(fmt::format("the learning rate must be above 0, not {}", base_lr));
  }
  if (total_steps < 1) {
    throw std::invalid_argument(
        fmt::format("a schedule needs at least one optimizer step, not {}", total_steps));
  }
  if (warmup_steps < 0) {
    warmup_steps = s.kind == Kind::OneCycle
                       ? std::max<std::int64_t>(1, static_cast<std::int64_t>(0.3 * total_steps))
                       : 0;
  }
  if (warmup_steps < 0 || warmup_steps >= total_steps) {
    throw std::invalid_argument(fmt::format(
        "{} warm-up steps leave none of the run's {} optimizer steps to the \"{}\" schedule",
        warmup_steps, total_steps, name));
  }
  if (s.kind == Kind::Step) {
    if (step_size <= 0) step_size = std::max<std::int64_t>(1, (total_steps - warmup_steps) / 3);
    if (!(gamma > 0 && gamma <= 1)) {
      throw std::invalid_argument(
          fmt::format("the step schedule's factor must be in (0, 1], not {}", gamma));
    }
  }
  s.base_lr = base_lr;
  s.total_steps = total_steps;
  s.warmup_steps = warmup_steps;
  s.step_size = step_size;
  s.gamma = gamma;
  return s;
}

double LrSchedule::lr_at(std::int64_t step) const {
  step = std::max<std::int64_t>(step, 0);
  if (kind == Kind::OneCycle) {
    const double low = base_lr / kOneCycleDiv;
    if (step < warmup_steps) {
      return cosine_between(low, base_lr, static_cast<double>(step) / warmup_steps);
    }
    const double rest = std::max<double>(1, static_cast<double>(total_steps - 1 - warmup_steps));
    return cosine_between(base_lr, low / kOneCycleFinalDiv, (step - warmup_steps) / rest);
  }
  if (step < warmup_steps) return base_lr * static_cast<double>(step + 1) / (warmup_steps + 1);
  const std::int64_t after = step - warmup_steps;
  switch (kind) {
    case Kind::Constant:
      return base_lr;
    case Kind::Step:
      return base_lr * std::pow(gamma, static_cast<double>(after / step_size));
    case Kind::Cosine:
      return cosine_between(
          base_lr, 0, static_cast<double>(after) / static_cast<double>(total_steps - warmup_steps));
    case Kind::OneCycle:
      break;
  }
  return base_lr;
}

std::string LrSchedule::describe() const {
  std::string out = fmt::format("{} from {:g} over {} steps", core::name_of(kind_names(), kind),
                                base_lr, total_steps);
  if (kind == Kind::Step) out += fmt::format(", x{:g} every {}", gamma, step_size);
  if (warmup_steps > 0) out += fmt::format(", {} warm-up", warmup_steps);
  return out;
}

}  // namespace ferry::dist_autograd
