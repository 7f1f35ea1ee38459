// The trainer's settings of enum type and the plan's settings, as the apps parse them once from
// their flags (and the planner from a plan file): each enum with the words that name it, read
// both ways (ferry/core/enum_names.h). Value types; no LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ferry/core/enum_names.h"
#include "ferry/core/image_size.h"
#include "ferry/pipeline/schedules.h"

namespace ferry::trainer {

enum class Optimizer { Sgd, Adam, AdamW };
const core::EnumNames<Optimizer>& optimizer_names();  // sgd, adam, adamw

// What --stages N balances, from each block's measured costs.
enum class Balance { Memory, Time, Parameters };
const core::EnumNames<Balance>& balance_names();  // memory, time, parameters

// Where steps compute the loss: the last stage (only its value comes to the master), the master
// (the logits come to it), or auto (the last stage in pipelined steps, the master in plain ones).
enum class LossPlacement { Auto, LastStage, Master };
const core::EnumNames<LossPlacement>& loss_placement_names();  // auto, last-stage, master

// Whether a pipelined job moves blocks between stages while it runs: auto (when the cut was
// balanced by time), on, off.
enum class Rebalance { Auto, On, Off };
const core::EnumNames<Rebalance>& rebalance_names();  // auto, on, off

// The validation metric that picks the best epoch and stops early.
enum class Monitor { ValLoss, ValIou, ValDice, ValMiou };
const core::EnumNames<Monitor>& monitor_names();  // val_loss, val_iou, val_dice, val_miou

// How a step runs: plain (no schedule: each stage once per step) or pipelined under a schedule.
using StepSchedule = std::optional<pipeline::Schedule>;
// "plain", then the schedules' names ("gpipe", "1f1b", "zb"), as plan files and tables write them.
const core::EnumNames<StepSchedule>& step_schedule_names();

struct PlanSettings {
  std::string model = "unet-resnet34";
  int64_t classes = 1;
  core::ImageSize image_size = 128;
  int64_t batch_size = 8;
  int stages = 0;                     // 0: the three seams (unless `partition` is set)
  Balance balance = Balance::Memory;  // what `stages` balances
  std::string partition;  // the first block of each stage after the first, comma-separated
  Optimizer optimizer = Optimizer::Adam;  // its state per parameter enters the memory estimate
  // Samples whose activations a stage holds at once: the batch for plain and GPipe steps, fewer
  // for 1F1B (see in_flight_samples); and of those, the samples whose weight pass waits under the
  // zero-bubble schedule (deferred_samples).
  int64_t in_flight_samples = 0;  // 0: the batch
  int64_t deferred_samples = 0;
  int microbatches = 1;    // a step's forwards and backwards per stage
  bool recompute = false;  // every stage runs its forward again in backward
  int threads = 0;         // each stage's intra-op threads; 0: this process's
  // Stages computing beside each one on its machine (models::CostSampling::neighbours); needs
  // `threads` 1.
  int neighbours = 0;
};

// --memory-budget-mib: each process's tensor memory bound, as a device's. One value bounds every
// rank; one per worker, in rank order, serves workers of unequal memory (the master, which holds
// no stage, is then unbounded). Value type.
struct MemoryBudget {
  std::vector<int64_t> mib;  // empty: none

  // "300" or "300,160,160". Throws std::invalid_argument naming a value that is not a whole
  // number of MiB from 1.
  static MemoryBudget parse(const std::string& text);
  bool none() const { return mib.empty(); }
  bool per_worker() const { return mib.size() > 1; }
  // Rank `rank`'s bound in MiB (0: none); per worker, rank r's is the r-th value.
  int64_t of_rank(int rank) const;
  // The largest bound, in MiB (0: none).
  int64_t largest() const;
  std::string text() const;  // as parsed
};

}  // namespace ferry::trainer
