// How a job cuts the U-Net into stages before it builds any: at its three seams (the default),
// into N stages balanced by measured memory, time or parameters (--stages N --balance ...), or
// at the blocks a user names (--partition). Each stage's parameters, estimated peak memory and
// compute per step are worked out from the blocks' costs, measured at the run's micro-batch size
// with the threads a stage will have, for the table `train` prints and `describe` prints or
// writes as JSON.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ferry/core/image_size.h"
#include "ferry/models/block_costs.h"
#include "ferry/models/remote_unet.h"
#include "ferry/pipeline/partition.h"
#include "ferry/trainer/settings.h"

namespace ferry::trainer {

// Bytes in a mebibyte: budgets are given, and peaks reported, in MiB.
constexpr double kMiB = 1 << 20;

// The sizes blocks are timed at for a batch of `batch_size` in `microbatches`: the micro-batch
// and, to tell a block's fixed cost from its cost per sample, half of it for plain steps or up to
// four times it (at most the batch) for pipelined ones, whose plain step is then predicted too.
models::CostSampling cost_sampling(int64_t batch_size, int microbatches, int threads);

// The samples of one micro-batch of a batch in `microbatches` (tensor_split's largest part).
int64_t microbatch_samples(int64_t batch_size, int microbatches);

// What a stage holds, in parts that scale differently with the samples. Value type.
//
// A stage peaks either in its optimizer step, which holds the parameters, the optimizer's state,
// the gradients twice (the autograd context's and the step's own; three times when micro-batches'
// gradients were summed) and the step's temporaries for its largest parameter; or in its
// backward, which holds the parameters, the optimizer's state, the gradients and the activations
// and carries of the samples in flight. A recomputing stage keeps only its inputs, and one
// micro-batch's activations while it recomputes; under the zero-bubble schedule, the activations
// of the micro-batches whose weight pass waits too.
struct StageMemoryTerms {
  double parameter_bytes = 0;  // the parameters; their gradients are as large
  double state_bytes = 0;      // the optimizer's state
  double step_temporary_bytes = 0;
  // The carry it receives and the one it sends, with their gradients, per sample held.
  double carry_bytes_per_sample = 0;
  // What its blocks' forwards keep until their backward, per sample.
  double activation_bytes_per_sample = 0;
  // The most its backward of one micro-batch holds, per sample: the activations of the blocks up
  // to one block and that block's backward beyond them
  // (BlockCost::backward_extra_bytes_per_sample), at the block where their sum is largest. At least
  // activation_bytes_per_sample.
  double working_bytes_per_sample = 0;
  // With `held_samples` in flight, in micro-batches of `microbatch` samples (`summed`: more than
  // one micro-batch per step), `deferred_samples` of them waiting for their weight pass (the
  // zero-bubble schedule's), which hold their activations even when the stage recomputes.
  double peak_bytes(int64_t held_samples, int64_t microbatch, bool summed, bool recompute,
                    int64_t deferred_samples = 0) const;
};

// The memory terms of the stage of blocks `range` of the U-Net of `settings.model` (its image
// size and optimizer), from the blocks' costs.
StageMemoryTerms stage_memory_terms(const std::vector<models::BlockCost>& costs,
                                    const pipeline::Range& range, const PlanSettings& settings);

// One stage of a plan. Value type.
struct PlannedStage {
  std::string name;
  int64_t first = 0, last = 0;  // blocks [first, last)
  std::string blocks;           // "layer2.3..decoder.0"
  int64_t parameters = 0;
  // Parameters, gradients and optimizer state, activations in flight, the carries in and out and
  // the optimizer step's temporaries.
  double peak_mib = 0;
  // Forward and backward of every micro-batch of one batch (and the recomputed forwards), from
  // the blocks' costs.
  double compute_s = 0;
};

struct StagePlan {
  int64_t depth = 0;
  std::string method;  // "seams", "balanced by memory", "manual"
  std::vector<models::BlockCost> costs;
  std::vector<PlannedStage> stages;
  // The plans for RemoteUnet::create, with `workers[k]` for stage k: "worker2" or, with a
  // device, "worker2/cuda:0" (PyTorch RemoteModule's form).
  std::vector<models::RemoteUnet::StagePlan> on(const std::vector<std::string>& workers) const;
  std::vector<pipeline::Range> ranges() const;
};

// Each block's compute per step for a batch of `batch_size` in `microbatches`, as
// stage_compute_s sums it.
std::vector<double> block_compute_s(const StagePlan& plan, int64_t batch_size, int microbatches,
                                    bool recompute);

// Each stage's compute per step for a batch of `batch_size` in `microbatches` (with `recompute`,
// each forward twice) from the blocks' costs: a block's fixed part once per micro-batch, its part
// per sample once per sample.
std::vector<double> stage_compute_s(const StagePlan& plan, int64_t batch_size, int microbatches,
                                    bool recompute);

// The worker of a place: "worker2" of "worker2" and of "worker2/cuda:0".
std::string worker_of(const std::string& place);

// Which of `workers` workers (0: the first after the master) holds copy `replica` of stage
// `stage` of `replicas`: each replica its own equal share of the workers, in order, its stages
// round robin over that share. place_stages places by it, and the planner fits each stage's
// copies to those workers' budgets.
inline std::size_t worker_of_copy(std::size_t stage, std::size_t replica, std::size_t workers,
                                  std::size_t replicas) {
  const std::size_t share = std::max<std::size_t>(1, workers / replicas);
  return replica * share + stage % share;
}

// The optimizer's state per parameter byte: a momentum for SGD; two moments for Adam and AdamW.
double optimizer_state_copies(Optimizer optimizer);

// Each of `values` (one per stage, at `places`) replaced by the sum over the stages on its
// worker: what that worker holds or computes for them all.
std::vector<double> summed_by_worker(const std::vector<double>& values,
                                     const std::vector<std::string>& places);

// The ranges of `cuts` (the first block of each stage after the first, "layer3.0,decoder.0")
// over the blocks of `costs`; rpc::Error(InvalidArgument) naming `flag` and listing how blocks are
// named if one is unknown or out of order.
std::vector<pipeline::Range> ranges_at_cuts(const std::vector<models::BlockCost>& costs,
                                            const std::string& flag, const std::string& cuts);

// "unet-resnet<depth>" -> depth; throws rpc::Error(InvalidArgument) naming the model otherwise.
int64_t depth_of(const std::string& model);

// The samples each stage holds activations for at once, at most: all of the batch for plain and
// GPipe steps, and for 1F1B with M micro-batches over p stages, min(M, p) micro-batches.
int64_t in_flight_samples(int64_t batch_size, int microbatches, bool one_f_one_b, int stages);

// Under the zero-bubble schedule, the samples of stage `stage` of `stages` whose weight pass waits
// at most (pipeline/deferred_weights.cc): on the last stage one micro-batch besides the one in
// flight, on the others all but one of their places (stages - stage micro-batches); none where a
// step is one micro-batch.
int64_t deferred_samples(int64_t batch_size, int microbatches, int stages, int stage);

// Measures the blocks (in this process) and cuts them. Bad settings (an unknown balance, a
// partition naming no block, more stages than blocks) are rpc::Error(InvalidArgument) naming the
// flag.
StagePlan plan_stages(const PlanSettings& settings);
// The same from blocks measured before (a plan's, from the block-cost cache): nothing is measured.
// Costs of another model's blocks are rpc::Error(InvalidArgument).
StagePlan plan_stages_from(const PlanSettings& settings, std::vector<models::BlockCost> costs);

// `plan`'s blocks cut into `ranges` instead, without measuring them again: for a running job cut
// anew. Its stages keep the names of `plan`'s, in order; `method` says how the ranges were found.
StagePlan recut(const StagePlan& plan, const PlanSettings& settings,
                const std::vector<pipeline::Range>& ranges, const std::string& method);

// A table of the plan: one row per stage with its worker (if given), blocks, parameters,
// estimated peak and compute per step.
std::string plan_table(const StagePlan& plan, const std::vector<std::string>& workers = {});
// The plan as JSON: {"model", "method", "stages": [{name, blocks, first, last, parameters,
// estimated_peak_mib, estimated_compute_s}], "total_parameters"}.
nlohmann::ordered_json plan_json(const StagePlan& plan);

}  // namespace ferry::trainer
