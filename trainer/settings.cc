#include "ferry/trainer/settings.h"

namespace ferry::trainer {

const core::EnumNames<Optimizer>& optimizer_names() {
  static const core::EnumNames<Optimizer> names = {
      {Optimizer::Sgd, "sgd"}, {Optimizer::Adam, "adam"}, {Optimizer::AdamW, "adamw"}};
  return names;
}

const core::EnumNames<Balance>& balance_names() {
  static const core::EnumNames<Balance> names = {
      {Balance::Memory, "memory"}, {Balance::Time, "time"}, {Balance::Parameters, "parameters"}};
  return names;
}

const core::EnumNames<LossPlacement>& loss_placement_names() {
  static const core::EnumNames<LossPlacement> names = {{LossPlacement::Auto, "auto"},
                                                       {LossPlacement::LastStage, "last-stage"},
                                                       {LossPlacement::Master, "master"}};
  return names;
}

const core::EnumNames<Rebalance>& rebalance_names() {
  static const core::EnumNames<Rebalance> names = {
      {Rebalance::Auto, "auto"}, {Rebalance::On, "on"}, {Rebalance::Off, "off"}};
  return names;
}

const core::EnumNames<Monitor>& monitor_names() {
  static const core::EnumNames<Monitor> names = {{Monitor::ValLoss, "val_loss"},
                                                 {Monitor::ValIou, "val_iou"},
                                                 {Monitor::ValDice, "val_dice"},
                                                 {Monitor::ValMiou, "val_miou"}};
  return names;
}

const core::EnumNames<StepSchedule>& step_schedule_names() {
  static const core::EnumNames<StepSchedule> names = [] {
    core::EnumNames<StepSchedule> all = {{std::nullopt, "plain"}};
    for (const auto& [schedule, word] : pipeline::schedule_names())
      all.emplace_back(schedule, word);
    return all;
  }();
  return names;
}

}  // namespace ferry::trainer
