// `ferry-master plan` and `train --plan`: the blocks' costs measured (or taken from the cache),
// the configurations searched (planner.h), the best few checked with real short runs on a local
// world of fresh processes under the budget, a ranked table and the winner's `train` flags; and
// a plan's settings applied to a training job.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ferry/core/image_size.h"
#include "ferry/trainer/settings.h"
#include "ferry/trainer/train.h"

namespace ferry::trainer {

// What to plan for. Value type.
struct PlanRequest {
  std::string model = "unet-resnet34";
  int64_t classes = 1;
  core::ImageSize image_size = 128;
  Optimizer optimizer = Optimizer::Adam;
  int workers = 1;
  double budget_mib = 0;  // each worker's tensor memory; 0: none
  // One budget per worker, in rank order, where they differ (budget_mib is then the largest); a
  // stage fits the least of the workers its copies go to (place_stages' order).
  std::vector<double> worker_budget_mib;
  // The batch of one optimizer step over all replicas; 0 with `largest_batch`.
  int64_t batch_size = 8;
  bool largest_batch = false;  // the largest batch any configuration fits instead
  int64_t max_batch = 1 << 14;
};

struct PlanCommandSettings {
  PlanRequest request;
  int verify = 3;  // candidates checked with real steps (0: none); the one-process one besides
  int rows = 12;   // rows of the table
  std::string cache_dir;  // empty: default_cache_dir()
  int cores = 0;          // the cores the workers share; 0: this machine's
  // The cores one worker computes on at most: 1 where workers share a machine's cores (a worker's
  // extra threads then add little, docs/planning.md), a host's cores where each has its own.
  int cores_per_worker = 1;
  bool json = false;  // the plan as one JSON object, last on stdout
  // The programs that run a candidate's real steps: `launcher --nproc N -- master train FLAGS`.
  std::string launcher = "ferry-launch";
  std::string master = "ferry-master";
};

// Runs `plan`; returns the exit code (2 for settings that cannot work or nothing that fits, 1
// when no candidate checked passed its real steps, with the reason).
int run_plan(const PlanCommandSettings& settings);

// The plan of a training job's settings on `workers` workers (train --plan auto): its model,
// its --batch-size as the step's whole batch and its budget, predicted only (a running world
// cannot start others to check it). With `estimate_limit_mib` (0: the budget), only candidates
// whose estimated peaks stay within it, at the job's batch or, where none does, at the largest
// smaller batch one fits; the plan's budget stays the job's. Prints the table to stderr. Returns
// the plan's document.
nlohmann::ordered_json plan_for_training(const TrainSettings& settings, int workers,
                                         double estimate_limit_mib = 0);

// `settings` with a plan's winner (`plan --json`'s document) applied: model, image size,
// optimizer, batch, cut, replicas, schedule, micro-batches, recomputation and budget. Throws
// rpc::Error(InvalidArgument) naming `source` for a document that is not a plan.
TrainSettings with_plan(const TrainSettings& settings, const nlohmann::json& plan,
                        const std::string& source);

// The plan document in `path`; rpc::Error(InvalidArgument) naming the file when it cannot be read
// or is not JSON.
nlohmann::json read_plan_file(const std::string& path);

}  // namespace ferry::trainer
