#include "trainer/stage_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <stdexcept>

#include "ferry/models/unet.h"
#include "ferry/models/unet_blocks.h"
#include "ferry/pipeline/partition.h"
#include "ferry/rpc/error.h"

namespace ferry::trainer {

namespace {

// Bytes per parameter byte that training keeps, as the balance by memory sums them per block: the
// parameter, its gradient and the optimizer's state.
double state_factor(Optimizer optimizer) { return 2 + optimizer_state_copies(optimizer); }
// Tensors of one parameter's size that the optimizer's step makes and drops, one parameter at a
// time (Adam's square root of the second moment, its quotient and the update).
double step_temporaries(Optimizer optimizer) { return optimizer == Optimizer::Sgd ? 1 : 3; }

// The bytes per sample of each element of the carry after block `k` (-1: the image), bottom
// first: each element is the output of the block that made it.
std::vector<double> carry_elements(const std::vector<models::BlockCost>& costs,
                                   const std::vector<models::UnetBlock>& blocks, double image,
                                   int64_t k) {
  std::vector<double> carry{image};
  for (int64_t j = 0; j <= k; ++j) {
    const models::UnetBlock& block = blocks[j];
    if (block.carry_out > block.carry_in) {
      carry.push_back(0);
    } else {
      carry.resize(static_cast<size_t>(block.carry_out));
    }
    carry.back() = costs[j].output_bytes_per_sample;
  }
  return carry;
}

double sum_from(const std::vector<double>& values, int64_t from) {
  double sum = 0;
  for (size_t i = static_cast<size_t>(from); i < values.size(); ++i) sum += values[i];
  return sum;
}

// The bytes per sample of the carry after block `after`, less its `untouched` bottom elements.
double carry_bytes_per_sample(const std::vector<models::BlockCost>& costs,
                              const std::vector<models::UnetBlock>& blocks, double image,
                              int64_t after, int64_t untouched) {
  return sum_from(carry_elements(costs, blocks, image, after), untouched);
}

std::vector<double> memory_costs(const std::vector<models::BlockCost>& costs, double factor,
                                 int64_t samples) {
  std::vector<double> out;
  for (const auto& c : costs) {
    out.push_back(static_cast<double>(c.parameter_bytes) * factor +
                  c.activation_bytes_per_sample * static_cast<double>(samples));
  }
  return out;
}

// Each block's forward and backward over every micro-batch of a batch: tensor_split gives
// min(M, batch) micro-batches, so the fixed part counts that often and the part per sample once
// per sample.
std::vector<double> time_costs(const std::vector<models::BlockCost>& costs, int64_t batch,
                               int microbatches, bool recompute) {
  const double passes = static_cast<double>(std::min<int64_t>(std::max(microbatches, 1), batch));
  const double samples = static_cast<double>(batch);
  std::vector<double> out;
  for (const auto& c : costs) {
    const double forward = passes * c.forward.fixed_s + samples * c.forward.per_sample_s;
    const double backward = passes * c.backward.fixed_s + samples * c.backward.per_sample_s;
    out.push_back((recompute ? 2 : 1) * forward + backward);
  }
  return out;
}

std::vector<double> parameter_costs(const std::vector<models::BlockCost>& costs) {
  std::vector<double> out;
  for (const auto& c : costs) out.push_back(static_cast<double>(c.parameters));
  return out;
}

std::vector<pipeline::Range> cut(const PlanSettings& s, const std::vector<models::BlockCost>& costs,
                                 const std::vector<double>& memory, const std::vector<double>& time,
                                 std::string& method) {
  if (!s.partition.empty()) {
    std::vector<pipeline::Range> ranges = ranges_at_cuts(costs, "--partition", s.partition);
    if (s.stages > 0 && static_cast<int>(ranges.size()) != s.stages) {
      rpc::refuse(fmt::format("--partition {} makes {} stages but --stages is {}", s.partition,
                              ranges.size(), s.stages));
    }
    method = "manual";
    return ranges;
  }
  if (s.stages == 0) {
    method = "seams";
    std::vector<pipeline::Range> ranges;
    for (const auto& seam : models::RemoteUnet::seams(depth_of(s.model), {})) {
      ranges.push_back({seam.first, seam.last});
    }
    return ranges;
  }
  if (s.stages < 1 || s.stages > static_cast<int>(costs.size())) {
    rpc::refuse(fmt::format("--stages {}: the U-Net has {} blocks, so 1 to {} stages", s.stages,
                            costs.size(), costs.size()));
  }
  method = "balanced by " + core::name_of(balance_names(), s.balance);
  switch (s.balance) {
    case Balance::Time:
      return pipeline::partition_min_max(time, s.stages, memory);
    case Balance::Parameters:
      return pipeline::partition_min_max(parameter_costs(costs), s.stages, time);
    case Balance::Memory:
      break;
  }
  return pipeline::partition_min_max(memory, s.stages, time);
}

}  // namespace

std::string worker_of(const std::string& place) { return place.substr(0, place.find('/')); }

double optimizer_state_copies(Optimizer optimizer) { return optimizer == Optimizer::Sgd ? 1 : 2; }

std::vector<double> summed_by_worker(const std::vector<double>& values,
                                     const std::vector<std::string>& places) {
  std::map<std::string, double> by_worker;
  for (size_t k = 0; k < values.size(); ++k) by_worker[worker_of(places.at(k))] += values[k];
  std::vector<double> out;
  for (size_t k = 0; k < values.size(); ++k) out.push_back(by_worker[worker_of(places[k])]);
  return out;
}

std::vector<pipeline::Range> ranges_at_cuts(const std::vector<models::BlockCost>& costs,
                                            const std::string& flag, const std::string& cuts) {
  std::vector<std::string> names;
  for (const auto& c : costs) names.push_back(c.name);
  try {
    return pipeline::ranges_from_cuts(names, cuts);
  } catch (const std::invalid_argument& e) {
    rpc::refuse(
        fmt::format("{} {}: {} (the blocks: stem, layer1.0, ..., decoder.0, ..., head; "
                    "`ferry-master describe --blocks` lists them)",
                    flag, cuts, e.what()));
  }
}

int64_t depth_of(const std::string& model) {
  const std::string prefix = "unet-resnet";
  int64_t depth = 0;
  if (model.rfind(prefix, 0) == 0) {
    try {
      depth = std::stoll(model.substr(prefix.size()));
    } catch (const std::exception&) {
    }
  }
  if (depth == 0) {
    rpc::refuse(
        fmt::format("unknown model \"{}\" (models: unet-resnet18, unet-resnet34, unet-resnet50, "
                    "unet-resnet101, unet-resnet152)",
                    model));
  }
  models::resnet_channels(depth);  // throws for a depth that does not exist
  return depth;
}

models::CostSampling cost_sampling(int64_t batch_size, int microbatches, int threads) {
  models::CostSampling sampling;
  sampling.samples = std::max<int64_t>(microbatch_samples(batch_size, microbatches), 1);
  if (std::min<int64_t>(std::max(microbatches, 1), batch_size) > 1) {
    sampling.second_samples = std::min(batch_size, 4 * sampling.samples);
  }
  sampling.threads = threads;
  return sampling;
}

std::vector<double> stage_compute_s(const StagePlan& plan, int64_t batch_size, int microbatches,
                                    bool recompute) {
  return pipeline::range_costs(time_costs(plan.costs, batch_size, microbatches, recompute),
                               plan.ranges());
}

int64_t in_flight_samples(int64_t batch_size, int microbatches, bool one_f_one_b, int stages) {
  if (!one_f_one_b || microbatches <= 1) return batch_size;
  const int64_t per_microbatch = (batch_size + microbatches - 1) / microbatches;
  return std::min<int64_t>(batch_size, per_microbatch * std::min(microbatches, stages));
}

std::vector<models::RemoteUnet::StagePlan> StagePlan::on(
    const std::vector<std::string>& workers) const {
  std::vector<models::RemoteUnet::StagePlan> out;
  for (size_t k = 0; k < stages.size(); ++k) {
    const std::string& place = workers.at(k);
    const std::string worker = worker_of(place);
    out.push_back({stages[k].name, stages[k].first, stages[k].last, worker,
                   place.size() > worker.size() ? place.substr(worker.size() + 1) : ""});
  }
  return out;
}

namespace {

// Fills `plan.stages` from `ranges` over `plan.costs`: names (`names`, or by the plan's method),
// blocks, parameters, and estimated peak and compute.
void fill_stages(StagePlan& plan, const PlanSettings& s, const std::vector<pipeline::Range>& ranges,
                 const std::vector<std::string>& names) {
  const int64_t samples = s.in_flight_samples > 0 ? s.in_flight_samples : s.batch_size;
  const std::vector<double> stage_time = pipeline::range_costs(
      time_costs(plan.costs, s.batch_size, s.microbatches, s.recompute), ranges);
  const std::vector<double> stage_parameters =
      pipeline::range_costs(parameter_costs(plan.costs), ranges);
  const std::vector<models::RemoteUnet::StagePlan> seams =
      models::RemoteUnet::seams(plan.depth, {});
  plan.stages.clear();
  for (size_t k = 0; k < ranges.size(); ++k) {
    PlannedStage stage;
    stage.name = k < names.size()         ? names[k]
                 : plan.method == "seams" ? seams[k].name
                                          : fmt::format("stage{}", k);
    stage.first = ranges[k].begin;
    stage.last = ranges[k].end;
    const std::string& from = plan.costs[stage.first].name;
    const std::string& to = plan.costs[stage.last - 1].name;
    stage.blocks = stage.last - stage.first == 1 ? from : fmt::format("{}..{}", from, to);
    stage.parameters = static_cast<int64_t>(stage_parameters[k]);
    const int64_t microbatch = microbatch_samples(s.batch_size, s.microbatches);
    stage.peak_mib = stage_memory_terms(plan.costs, ranges[k], s)
                         .peak_bytes(samples, microbatch, microbatch < s.batch_size, s.recompute,
                                     s.deferred_samples) /
                     kMiB;
    stage.compute_s = stage_time[k];
    plan.stages.push_back(stage);
  }
}

}  // namespace

int64_t microbatch_samples(int64_t batch_size, int microbatches) {
  const int64_t parts =
      std::min<int64_t>(std::max(microbatches, 1), std::max<int64_t>(batch_size, 1));
  return (batch_size + parts - 1) / parts;
}

int64_t deferred_samples(int64_t batch_size, int microbatches, int stages, int stage) {
  const int64_t parts =
      std::min<int64_t>(std::max(microbatches, 1), std::max<int64_t>(batch_size, 1));
  if (parts <= 1) return 0;
  const int64_t places = std::min<int64_t>(parts, stages - stage);
  const int64_t waiting = stage + 1 == stages ? 1 : places - 1;
  return std::min(waiting, parts - 1) * microbatch_samples(batch_size, microbatches);
}

double StageMemoryTerms::peak_bytes(int64_t held_samples, int64_t microbatch, bool summed,
                                    bool recompute, int64_t deferred_samples) const {
  const auto held = static_cast<double>(held_samples);
  const double step = (summed ? 3 : 2) * parameter_bytes + step_temporary_bytes;
  // The micro-batch whose backward runs holds its working set; the other micro-batches in flight
  // hold their whole activations meanwhile, or, recomputed, only those whose weight pass waits.
  const double others = recompute ? static_cast<double>(deferred_samples)
                                  : std::max(held - static_cast<double>(microbatch), 0.0);
  const double backward = parameter_bytes + carry_bytes_per_sample * held +
                          activation_bytes_per_sample * others +
                          working_bytes_per_sample * static_cast<double>(microbatch);
  return parameter_bytes + state_bytes + std::max(step, backward);
}

StageMemoryTerms stage_memory_terms(const std::vector<models::BlockCost>& costs,
                                    const pipeline::Range& range, const PlanSettings& s) {
  StageMemoryTerms terms;
  int64_t largest = 0;
  for (int64_t k = range.begin; k < range.end; ++k) {
    const models::BlockCost& c = costs.at(static_cast<size_t>(k));
    largest = std::max(largest, c.largest_parameter_bytes);
    terms.parameter_bytes += static_cast<double>(c.parameter_bytes);
    terms.working_bytes_per_sample =
        std::max(terms.working_bytes_per_sample, terms.activation_bytes_per_sample +
                                                     c.activation_bytes_per_sample +
                                                     c.backward_extra_bytes_per_sample);
    terms.activation_bytes_per_sample += c.activation_bytes_per_sample;
  }
  terms.state_bytes = terms.parameter_bytes * optimizer_state_copies(s.optimizer);
  terms.step_temporary_bytes = step_temporaries(s.optimizer) * static_cast<double>(largest);
  // The carry it receives and the carry it sends, each with its gradient; the skips beneath,
  // which its blocks do not touch, go past it (RemoteUnet::routes()).
  const std::vector<models::UnetBlock> blocks = models::unet_blocks(depth_of(s.model));
  const int64_t untouched = models::unet_carry_untouched(blocks, range.begin, range.end);
  const double image = 3.0 * static_cast<double>(s.image_size.pixels()) * sizeof(float);
  terms.carry_bytes_per_sample =
      2 * (carry_bytes_per_sample(costs, blocks, image, range.begin - 1, untouched) +
           carry_bytes_per_sample(costs, blocks, image, range.end - 1, untouched));
  return terms;
}

namespace {

void check_settings(const PlanSettings& s) {
  if (s.stages < 0) rpc::refuse(fmt::format("--stages {} is not a number of stages", s.stages));
  if (s.batch_size < 1) rpc::refuse(fmt::format("--batch-size {} is not a batch", s.batch_size));
  if (s.microbatches < 1) {
    rpc::refuse(fmt::format("--microbatches {} is not a number of micro-batches", s.microbatches));
  }
  if (s.neighbours < 0)
    rpc::refuse(fmt::format("--neighbours {} is not a number of stages", s.neighbours));
  if (s.neighbours > 0 && s.threads != 1) {
    rpc::refuse(
        fmt::format("--neighbours {} needs --threads 1: the stages beside each other compute "
                    "on one core each, and so does the one timed beside them",
                    s.neighbours));
  }
}

// The cut of `costs` the settings ask for; `method` says how it was found.
std::vector<pipeline::Range> cut_of(const PlanSettings& s,
                                    const std::vector<models::BlockCost>& costs,
                                    std::string& method) {
  const int64_t samples = s.in_flight_samples > 0 ? s.in_flight_samples : s.batch_size;
  const std::vector<double> memory = memory_costs(costs, state_factor(s.optimizer), samples);
  const std::vector<double> time = time_costs(costs, s.batch_size, s.microbatches, s.recompute);
  return cut(s, costs, memory, time, method);
}

}  // namespace

StagePlan plan_stages(const PlanSettings& s) {
  StagePlan plan;
  plan.depth = depth_of(s.model);
  check_settings(s);
  models::CostSampling sampling = cost_sampling(s.batch_size, s.microbatches, s.threads);
  sampling.neighbours = s.neighbours;
  // A balance by time needs the steadier figure of three timed passes; otherwise time is only
  // shown, and one pass saves start-up.
  sampling.timed_passes = s.balance == Balance::Time && s.stages > 0 ? 3 : 1;
  if (sampling.neighbours > 0 && s.balance == Balance::Time && s.stages > 1) {
    // Each stage's blocks are timed beside the other stages' (CostSampling::cut), which a first
    // cut from one pass of each block alone names.
    models::CostSampling rough = sampling;
    rough.neighbours = 0;
    rough.timed_passes = 1;
    const std::vector<pipeline::Range> first = cut_of(
        s, models::measure_unet_blocks(plan.depth, s.classes, s.image_size, rough), plan.method);
    for (size_t k = 1; k < first.size(); ++k) sampling.cut.push_back(first[k].begin);
  }
  plan.costs = models::measure_unet_blocks(plan.depth, s.classes, s.image_size, sampling);
  fill_stages(plan, s, cut_of(s, plan.costs, plan.method), {});
  return plan;
}

StagePlan plan_stages_from(const PlanSettings& s, std::vector<models::BlockCost> costs) {
  StagePlan plan;
  plan.depth = depth_of(s.model);
  check_settings(s);
  const size_t blocks = models::unet_blocks(plan.depth).size();
  if (costs.size() != blocks) {
    rpc::refuse(fmt::format("{} block costs given for {}, which has {} blocks", costs.size(),
                            s.model, blocks));
  }
  plan.costs = std::move(costs);
  fill_stages(plan, s, cut_of(s, plan.costs, plan.method), {});
  return plan;
}

StagePlan recut(const StagePlan& plan, const PlanSettings& s,
                const std::vector<pipeline::Range>& ranges, const std::string& method) {
  StagePlan out;
  out.depth = plan.depth;
  out.method = method;
  out.costs = plan.costs;
  std::vector<std::string> names;
  for (const PlannedStage& stage : plan.stages) names.push_back(stage.name);
  fill_stages(out, s, ranges, names);
  return out;
}

std::vector<pipeline::Range> StagePlan::ranges() const {
  std::vector<pipeline::Range> out;
  for (const PlannedStage& stage : stages) out.push_back({stage.first, stage.last});
  return out;
}

std::vector<double> block_compute_s(const StagePlan& plan, int64_t batch_size, int microbatches,
                                    bool recompute) {
  return time_costs(plan.costs, batch_size, microbatches, recompute);
}

std::string plan_table(const StagePlan& plan, const std::vector<std::string>& workers) {
  std::string out = fmt::format("{:<8} {:<10} {:<26} {:>11} {:>14} {:>12}\n", "stage", "worker",
                                "blocks", "parameters", "est. peak MiB", "est. compute s");
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    const PlannedStage& s = plan.stages[k];
    out += fmt::format("{:<8} {:<10} {:<26} {:>11} {:>14.0f} {:>12.2f}\n", s.name,
                       k < workers.size() ? workers[k] : "-", s.blocks, s.parameters, s.peak_mib,
                       s.compute_s);
  }
  out += fmt::format(
      "{}; estimates from each block measured in one process: parameters, "
      "gradients and optimizer state, the activations a stage holds at once, and the forward and "
      "backward of a step's micro-batches\n",
      plan.method == "seams" ? "cut at the seams" : plan.method);
  return out;
}

nlohmann::ordered_json plan_json(const StagePlan& plan) {
  nlohmann::ordered_json out;
  out["method"] = plan.method;
  out["stages"] = nlohmann::ordered_json::array();
  int64_t total = 0;
  for (const PlannedStage& s : plan.stages) {
    out["stages"].push_back({{"name", s.name},
                             {"blocks", s.blocks},
                             {"first", s.first},
                             {"last", s.last},
                             {"parameters", s.parameters},
                             {"estimated_peak_mib", s.peak_mib},
                             {"estimated_compute_s", s.compute_s}});
    total += s.parameters;
  }
  out["total_parameters"] = total;
  return out;
}

}  // namespace ferry::trainer
