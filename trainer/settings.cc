#include "ferry/trainer/settings.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <sstream>
#include <stdexcept>

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

MemoryBudget MemoryBudget::parse(const std::string& text) {
  MemoryBudget out;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    std::size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 1 || value > (1ll << 40)) {
      throw std::invalid_argument(fmt::format(
          "\"{}\" is not a whole number of MiB from 1 (one for every process, or one per "
          "worker: 300,160,160)",
          item));
    }
    out.mib.push_back(value);
  }
  if (out.mib.empty() || text.back() == ',') {
    throw std::invalid_argument(fmt::format("\"{}\" gives no budget", text));
  }
  return out;
}

int64_t MemoryBudget::of_rank(int rank) const {
  if (mib.empty()) return 0;
  if (!per_worker()) return mib.front();
  if (rank < 1 || rank > static_cast<int>(mib.size())) return 0;
  return mib[static_cast<std::size_t>(rank) - 1];
}

int64_t MemoryBudget::largest() const {
  return mib.empty() ? 0 : *std::max_element(mib.begin(), mib.end());
}

std::string MemoryBudget::text() const { return fmt::format("{}", fmt::join(mib, ",")); }

}  // namespace ferry::trainer
