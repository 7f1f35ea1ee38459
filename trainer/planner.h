// The search behind `ferry-master plan`: every way to train the U-Net on W workers (stages p and
// replicas r with p x r <= W, a schedule, micro-batches, recomputation, the batch) scored from
// the blocks' measured costs, those that exceed a worker's memory budget dropped, the rest
// ranked. Pure arithmetic on a cost table: it measures nothing and starts nothing, so a
// hand-made table tests it (the real steps that check a plan are in plan_command.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ferry/core/image_size.h"
#include "ferry/models/block_costs.h"
#include "ferry/pipeline/partition.h"
#include "ferry/trainer/plan_command.h"
#include "ferry/trainer/settings.h"

namespace ferry::trainer {

// What a machine does besides the blocks' compute, measured once beside them (and cached with
// them). Value type.
struct MachineCosts {
  int cores = 1;                  // the cores the workers share (this machine's, for a local world)
  int cores_per_worker = 1;       // the most one worker can use (a host's cores)
  double thread_speedup = 1;      // a block's speed with `cores_per_worker` threads over one thread
  double link_bytes_per_s = 1e9;  // between two workers (the all-reduce and the carries)
  double optimizer_s_per_parameter = 0;  // one optimizer step, per parameter, on one thread
};

// A step's seconds in the terms a real step is measured by: the slowest stage's own compute
// (forward, recomputation and backward of all its micro-batches), the optimizer's step, and the
// rest (a pipeline's fill and drain or, in plain steps, the other stages' compute; the carries
// between stages; the replicas' all-reduce; the master's own work, where measured). Value type.
struct StepTerms {
  double step_s = 0, slowest_stage_s = 0, optimizer_s = 0;
  double rest_s() const { return step_s - slowest_stage_s - optimizer_s; }
};

// One way to train. Value type.
struct Candidate {
  int stages = 1;
  int replicas = 1;
  StepSchedule schedule;  // none: plain steps
  int microbatches = 1;
  bool recompute = false;
  int64_t batch_size = 0;  // per replica: the step's batch is batch_size x replicas
  // The batch the estimates gave, where real steps ran out of memory there and found a smaller
  // one (plan_checks.h); 0 otherwise.
  int64_t predicted_batch_size = 0;
  std::vector<pipeline::Range> cut;
  std::vector<double> predicted_peak_mib;  // per stage
  double predicted_step_s = 0;
  StepTerms predicted_terms;  // predicted_step_s by term
  // Filled by a real step (plan_command.h); negative until then.
  std::vector<double> measured_peak_mib;
  double measured_images_per_s = -1;
  StepTerms measured_terms;  // of the real step; step_s 0 where it was not read
  std::string verify_error;  // why the real step failed, if it did

  int64_t global_batch() const { return batch_size * replicas; }
  double predicted_largest_peak_mib() const;
  double measured_largest_peak_mib() const;
  double predicted_images_per_s() const;
  bool verified() const { return measured_images_per_s >= 0; }
  // "2 stages x 2 replicas, 1f1b x 8, recomputed"
  std::string describe() const;
  // The `ferry-master train` arguments that train it (the cut by block name, from
  // `block_names`), and the same as one line.
  std::vector<std::string> arguments(const PlanRequest& request,
                                     const std::vector<std::string>& block_names) const;
  std::string flags(const PlanRequest& request, const std::vector<std::string>& block_names) const;
};

// Thrown when no configuration fits: its message names the limit that binds and what would fit.
struct NothingFits : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Every configuration that fits, fastest first (with `largest_batch`: largest batch first, then
// fastest). Throws NothingFits when none does, std::invalid_argument for a request that is not
// one (no workers, a batch below 1, costs that do not match the model).
std::vector<Candidate> plan_candidates(const std::vector<models::BlockCost>& costs,
                                       const MachineCosts& machine, const PlanRequest& request);

// The candidate's step time and stage peaks from the costs, filled in place (the search's own
// scoring, for a configuration given by hand).
void score_candidate(const std::vector<models::BlockCost>& costs, const MachineCosts& machine,
                     const PlanRequest& request, Candidate& candidate);

// The first block of each stage of `cut`, by name.
std::vector<std::string> first_blocks(const std::vector<pipeline::Range>& cut,
                                      const std::vector<std::string>& block_names);
// `--partition`'s value for a cut whose stages begin at `first_blocks`: all but the first,
// comma-separated ("" for one stage).
std::string partition_of(const std::vector<std::string>& first_blocks);

// The ranked table (plan_report.cc): configuration, batch (and the estimates' batch where real
// steps found a smaller one), predicted and (where verified) measured largest peak per worker and
// images per second; then, for each verified candidate of more than one worker whose step was
// measured, its step by term against the estimate's, naming the term that is off the most.
std::string candidates_table(const std::vector<Candidate>& candidates, size_t rows);

// {"request", "winner": {settings, "flags"}, "candidates": [...]}: what `plan --json` prints and
// `train --plan FILE` reads.
nlohmann::ordered_json plan_document(const PlanRequest& request,
                                     const std::vector<std::string>& block_names,
                                     const std::vector<Candidate>& candidates,
                                     const Candidate& winner);

}  // namespace ferry::trainer
