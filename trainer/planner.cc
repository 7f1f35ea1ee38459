#include "trainer/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "ferry/models/unet_blocks.h"
#include "trainer/stage_plan.h"

namespace ferry::trainer {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

PlanSettings settings_of(const PlanRequest& r) {
  PlanSettings s;
  s.model = r.model;
  s.classes = r.classes;
  s.image_size = r.image_size;
  s.optimizer = r.optimizer;
  return s;
}

// Every stage of blocks [i, j): its memory terms and sums of the blocks' times and parameters,
// worked out once per search.
class StageTable {
 public:
  StageTable(const std::vector<models::BlockCost>& costs, const PlanRequest& request)
      : n_(static_cast<int64_t>(costs.size())), costs_(costs) {
    const PlanSettings s = settings_of(request);
    terms_.resize(static_cast<size_t>(n_ * n_));
    for (int64_t i = 0; i < n_; ++i) {
      for (int64_t j = i + 1; j <= n_; ++j)
        terms_[index(i, j)] = stage_memory_terms(costs, {i, j}, s);
    }
    prefix_.assign(static_cast<size_t>(n_ + 1), Sums{});
    for (int64_t k = 0; k < n_; ++k) {
      const models::BlockCost& c = costs[static_cast<size_t>(k)];
      Sums next = prefix_[static_cast<size_t>(k)];
      next.forward_fixed += c.forward.fixed_s;
      next.forward_per_sample += c.forward.per_sample_s;
      next.backward_fixed += c.backward.fixed_s;
      next.backward_per_sample += c.backward.per_sample_s;
      next.parameters += static_cast<double>(c.parameters);
      next.parameter_bytes += static_cast<double>(c.parameter_bytes);
      prefix_[static_cast<size_t>(k + 1)] = next;
    }
  }

  int64_t blocks() const { return n_; }
  const StageMemoryTerms& terms(int64_t i, int64_t j) const { return terms_[index(i, j)]; }
  // One thread's forward and backward seconds over a batch of `samples` in `passes` parts.
  double forward_s(int64_t i, int64_t j, double passes, double samples) const {
    return passes * diff(i, j, &Sums::forward_fixed) +
           samples * diff(i, j, &Sums::forward_per_sample);
  }
  double backward_s(int64_t i, int64_t j, double passes, double samples) const {
    return passes * diff(i, j, &Sums::backward_fixed) +
           samples * diff(i, j, &Sums::backward_per_sample);
  }
  double parameters(int64_t i, int64_t j) const { return diff(i, j, &Sums::parameters); }
  double parameter_bytes(int64_t i, int64_t j) const { return diff(i, j, &Sums::parameter_bytes); }
  // The bytes per sample a stage ending at block j - 1 sends on (its output and the skips).
  double sent_per_sample(int64_t j) const {
    return j >= n_ ? 0 : costs_[static_cast<size_t>(j - 1)].carry_bytes_per_sample;
  }
  const std::vector<models::BlockCost>& costs() const { return costs_; }

 private:
  struct Sums {
    double forward_fixed = 0, forward_per_sample = 0, backward_fixed = 0, backward_per_sample = 0;
    double parameters = 0, parameter_bytes = 0;
  };
  size_t index(int64_t i, int64_t j) const { return static_cast<size_t>(i * n_ + (j - 1)); }
  double diff(int64_t i, int64_t j, double Sums::*field) const {
    return prefix_[static_cast<size_t>(j)].*field - prefix_[static_cast<size_t>(i)].*field;
  }

  int64_t n_;
  const std::vector<models::BlockCost>& costs_;
  std::vector<StageMemoryTerms> terms_;
  std::vector<Sums> prefix_;
};

// The micro-batches a step of `c` makes: as tensor_split makes them, at most the batch.
int parts_of(const Candidate& c) {
  return static_cast<int>(std::min<int64_t>(c.microbatches, std::max<int64_t>(c.batch_size, 1)));
}
int64_t microbatch_of(const Candidate& c) { return microbatch_samples(c.batch_size, parts_of(c)); }

// The samples stage `s` of `c` holds activations for at once: the batch, or under 1F1B and the
// zero-bubble schedule the micro-batches ahead of it, at most p - s; the zero-bubble schedule's
// last stage holds one more whose weight pass waits.
int64_t held_by(const Candidate& c, int s) {
  if (!c.schedule || c.schedule == pipeline::Schedule::GPipe) return c.batch_size;
  const int last = c.schedule == pipeline::Schedule::ZeroBubble && s + 1 == c.stages ? 1 : 0;
  return std::min<int64_t>(c.batch_size,
                           microbatch_of(c) * std::min(parts_of(c), c.stages - s + last));
}

double stage_peak_bytes(const StageTable& table, const Candidate& c, int s, int64_t i, int64_t j) {
  const int64_t deferred = c.schedule == pipeline::Schedule::ZeroBubble
                               ? deferred_samples(c.batch_size, parts_of(c), c.stages, s)
                               : 0;
  return table.terms(i, j).peak_bytes(held_by(c, s), microbatch_of(c), parts_of(c) > 1, c.recompute,
                                      deferred);
}

// A worker's speed over one thread's, with p x r workers sharing the machine's cores: fewer cores
// than a worker could use slow it in proportion (time slices), more speed it up along the
// measured speed-up of a worker's full share.
double worker_speed(const MachineCosts& m, int busy_workers) {
  const double share = std::min<double>(m.cores_per_worker,
                                        static_cast<double>(std::max(m.cores, 1)) / busy_workers);
  if (share <= 1 || m.cores_per_worker <= 1) return std::min(share, 1.0);
  return 1 + (m.thread_speedup - 1) * (share - 1) / (m.cores_per_worker - 1);
}

// The step of one replica from its stages' compute: the pipeline's fill and drain and its
// steady state, the carries between stages, the optimizer step (stages step at once) and the
// replicas' all-reduce of the largest stage's gradients.
StepTerms step_seconds(const StageTable& table, const MachineCosts& m, const Candidate& c,
                       const std::vector<pipeline::Range>& cut) {
  const double speed = worker_speed(m, c.stages * c.replicas);
  const double passes = static_cast<double>(parts_of(c));
  const auto samples = static_cast<double>(c.batch_size);
  double sum_forward = 0, sum_stage = 0, largest_stage = 0, largest_backward = 0;
  double carries = 0, optimizer = 0, all_reduce = 0;
  for (const pipeline::Range& r : cut) {
    const double forward =
        (c.recompute ? 2 : 1) * table.forward_s(r.begin, r.end, passes, samples) / speed;
    const double backward = table.backward_s(r.begin, r.end, passes, samples) / speed;
    sum_forward += forward;
    sum_stage += forward + backward;
    largest_stage = std::max(largest_stage, forward + backward);
    largest_backward = std::max(largest_backward, backward);
    carries += 2 * table.sent_per_sample(r.end) * samples / m.link_bytes_per_s;
    optimizer =
        std::max(optimizer, table.parameters(r.begin, r.end) * m.optimizer_s_per_parameter / speed);
    if (c.replicas > 1) {
      all_reduce =
          std::max(all_reduce, 2.0 * (c.replicas - 1) / c.replicas *
                                   table.parameter_bytes(r.begin, r.end) / m.link_bytes_per_s);
    }
  }
  double compute = sum_stage;
  if (c.schedule) {
    // Each stage's share of one micro-batch; the slowest sets the steady state. The zero-bubble
    // schedule fills the drain with weight passes: of the other stages' backwards, only the
    // input-gradient half (about half) stays on the critical path.
    const double steady = (passes - 1) * largest_stage / passes;
    compute = c.schedule == pipeline::Schedule::ZeroBubble
                  ? steady + (sum_forward + largest_backward) / passes
                  : steady + sum_stage / passes;
    carries /= passes;
  }
  return {compute + carries + optimizer + all_reduce, largest_stage, optimizer};
}

// Stage `stage`'s budget in bytes under `c`: with a budget per worker, the least of the workers
// its copies go to (place_stages: replica r's stages on its own share of the workers, in order).
double stage_budget(const PlanRequest& request, const Candidate& c, int64_t stage) {
  if (request.worker_budget_mib.empty()) {
    return request.budget_mib > 0 ? request.budget_mib * kMiB : kInf;
  }
  double least = kInf;
  for (int r = 0; r < c.replicas; ++r) {
    const std::size_t worker =
        worker_of_copy(static_cast<std::size_t>(stage), r, request.workers, c.replicas);
    if (worker < request.worker_budget_mib.size()) {
      least = std::min(least, request.worker_budget_mib[worker] * kMiB);
    }
  }
  return least;
}

// The cut of `c.stages` stages whose slowest stage is fastest among those whose every stage
// fits its budget; empty if none fits.
std::vector<pipeline::Range> fitting_cut(const StageTable& table, const PlanRequest& request,
                                         const Candidate& c) {
  const int64_t n = table.blocks();
  if (c.stages > n) return {};
  const double passes = static_cast<double>(parts_of(c));
  const auto samples = static_cast<double>(c.batch_size);
  std::vector<double> time;
  for (int64_t k = 0; k < n; ++k) {
    time.push_back((c.recompute ? 2 : 1) * table.forward_s(k, k + 1, passes, samples) +
                   table.backward_s(k, k + 1, passes, samples));
  }
  return pipeline::partition_min_max_where(
      time, c.stages, [&](int64_t stage, int64_t begin, int64_t end) {
        return stage_peak_bytes(table, c, static_cast<int>(stage), begin, end) <=
               stage_budget(request, c, stage);
      });
}

// `c`'s peaks per stage and step time, for its cut.
void fill_scores(const StageTable& table, const MachineCosts& m, Candidate& c) {
  c.predicted_peak_mib.clear();
  for (size_t s = 0; s < c.cut.size(); ++s) {
    c.predicted_peak_mib.push_back(
        stage_peak_bytes(table, c, static_cast<int>(s), c.cut[s].begin, c.cut[s].end) / kMiB);
  }
  c.predicted_terms = step_seconds(table, m, c, c.cut);
  c.predicted_step_s = c.predicted_terms.step_s;
}

// `c` with its cut and scores, if some cut of it fits.
std::optional<Candidate> scored(const StageTable& table, const MachineCosts& m,
                                const PlanRequest& request, Candidate c) {
  c.cut = fitting_cut(table, request, c);
  if (c.cut.empty()) return std::nullopt;
  fill_scores(table, m, c);
  return c;
}

// The configurations of p stages x r replicas at a per-replica batch (micro-batches up to the
// batch), not yet cut.
std::vector<Candidate> shapes_of(int p, int r, int64_t batch) {
  auto shape = [&](StepSchedule schedule, int microbatches, bool recompute) {
    Candidate c;
    c.stages = p;
    c.replicas = r;
    c.schedule = schedule;
    c.microbatches = microbatches;
    c.recompute = recompute;
    c.batch_size = batch;
    return c;
  };
  std::vector<Candidate> out{shape(std::nullopt, 1, false)};
  for (int m = 2; m <= 32 && m <= batch; m *= 2) {
    for (const auto& [schedule, name] : pipeline::schedule_names()) {
      // One stage has no bubble to fill: 1F1B there is micro-batching alone.
      if (p == 1 && schedule != pipeline::Schedule::OneFOneB) continue;
      for (bool recompute : {false, true}) out.push_back(shape(schedule, m, recompute));
    }
  }
  return out;
}

// The largest per-replica batch at which `c` fits (its micro-batches unchanged), by
// bisection on the predicted peaks; 0 if not even its micro-batch count of samples fits.
int64_t largest_fitting_batch(const StageTable& table, const PlanRequest& request, Candidate c) {
  int64_t good = 0, bad = request.max_batch / c.replicas + 1;
  int64_t low = c.microbatches;
  c.batch_size = low;
  if (fitting_cut(table, request, c).empty()) return 0;
  good = low;
  while (bad - good > 1) {
    c.batch_size = good + (bad - good) / 2;
    if (fitting_cut(table, request, c).empty()) {
      bad = c.batch_size;
    } else {
      good = c.batch_size;
    }
  }
  return good;
}

// The shapes tried for a request: every p x r <= W with each schedule, micro-batches and
// recomputation, at the request's batch (split over the replicas) or at the largest each fits.
std::vector<Candidate> search(const StageTable& table, const MachineCosts& m,
                              const PlanRequest& request) {
  std::vector<Candidate> out;
  const int max_stages = static_cast<int>(std::min<int64_t>(request.workers, table.blocks()));
  for (int p = 1; p <= max_stages; ++p) {
    for (int r = 1; p * r <= request.workers; ++r) {
      if (!request.largest_batch) {
        if (request.batch_size % r != 0) continue;
        for (const Candidate& shape : shapes_of(p, r, request.batch_size / r)) {
          if (auto c = scored(table, m, request, shape)) out.push_back(*c);
        }
        continue;
      }
      for (Candidate shape : shapes_of(p, r, 32)) {
        shape.batch_size = largest_fitting_batch(table, request, shape);
        if (shape.batch_size == 0) continue;
        if (auto c = scored(table, m, request, shape)) out.push_back(*c);
      }
    }
  }
  return out;
}

std::string mib(double bytes) { return fmt::format("{:.0f} MiB", bytes / kMiB); }

// Why nothing fits: the limit that binds, and what would fit.
std::string nothing_fits(const StageTable& table, const MachineCosts& m,
                         const PlanRequest& request) {
  const std::vector<models::BlockCost>& costs = table.costs();
  // A block's peak with nothing in flight: its optimizer step's.
  auto state_of = [&](size_t k) {
    return table.terms(static_cast<int64_t>(k), static_cast<int64_t>(k) + 1)
        .peak_bytes(0, 0, false, false);
  };
  size_t heaviest = 0;
  for (size_t k = 0; k < costs.size(); ++k) {
    if (state_of(k) > state_of(heaviest)) heaviest = k;
  }
  const double budget = request.budget_mib * kMiB;
  const double state = state_of(heaviest);
  const std::string each =
      request.worker_budget_mib.empty()
          ? fmt::format("{:.0f} MiB each", request.budget_mib)
          : fmt::format("{:.0f} MiB", fmt::join(request.worker_budget_mib, ", "));
  const std::string where =
      fmt::format("{} at {} on {} worker{} of {}", request.model, request.image_size.extent(),
                  request.workers, request.workers == 1 ? "" : "s", each);
  if (state > budget) {
    return fmt::format(
        "nothing fits {}: block {}'s parameters, gradients and {} state alone take {}, more than "
        "a worker's budget; it needs a larger budget{}",
        where, costs[heaviest].name, core::name_of(optimizer_names(), request.optimizer),
        mib(state),
        request.optimizer == Optimizer::Sgd ? ""
                                            : " or --optimizer sgd (one copy of state, not two)");
  }
  // The state alone, cut over every worker (no image in flight, plain steps).
  const int most_stages = static_cast<int>(std::min<int64_t>(request.workers, table.blocks()));
  Candidate bare;
  bare.stages = most_stages;
  bare.batch_size = 0;
  if (fitting_cut(table, request, bare).empty()) {
    return fmt::format(
        "nothing fits {}: the parameters, gradients and {} state alone, cut into {} stages, "
        "exceed a worker's budget on some stage; it needs more workers, a larger budget{}",
        where, core::name_of(optimizer_names(), request.optimizer), most_stages,
        request.optimizer == Optimizer::Sgd ? ""
                                            : " or --optimizer sgd (one copy of state, not two)");
  }
  PlanRequest largest = request;
  largest.largest_batch = true;
  std::vector<Candidate> fitting = search(table, m, largest);
  if (fitting.empty()) {
    return fmt::format(
        "nothing fits {}, not even one image per step with every stage recomputed: the "
        "activations of one image and the state of the stages exceed each budget; it needs more "
        "workers, a smaller image or a larger budget",
        where);
  }
  const Candidate* best = &fitting.front();
  for (const Candidate& c : fitting) {
    if (c.global_batch() > best->global_batch()) best = &c;
  }
  return fmt::format(
      "batch {} does not fit {}: the activations bind, and the largest batch that fits is {} "
      "({}); a smaller batch, more workers, a smaller image or a larger budget would fit",
      request.batch_size, where, best->global_batch(), best->describe());
}

void rank(std::vector<Candidate>& candidates, bool largest_batch) {
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](const Candidate& a, const Candidate& b) {
                     if (largest_batch && a.global_batch() != b.global_batch()) {
                       return a.global_batch() > b.global_batch();
                     }
                     return a.predicted_images_per_s() > b.predicted_images_per_s();
                   });
}

}  // namespace

double Candidate::predicted_largest_peak_mib() const {
  return predicted_peak_mib.empty()
             ? 0
             : *std::max_element(predicted_peak_mib.begin(), predicted_peak_mib.end());
}

double Candidate::measured_largest_peak_mib() const {
  return measured_peak_mib.empty()
             ? -1
             : *std::max_element(measured_peak_mib.begin(), measured_peak_mib.end());
}

double Candidate::predicted_images_per_s() const {
  return predicted_step_s > 0 ? static_cast<double>(global_batch()) / predicted_step_s : 0;
}

void score_candidate(const std::vector<models::BlockCost>& costs, const MachineCosts& machine,
                     const PlanRequest& request, Candidate& candidate) {
  fill_scores(StageTable(costs, request), machine, candidate);
}

std::vector<Candidate> plan_candidates(const std::vector<models::BlockCost>& costs,
                                       const MachineCosts& machine, const PlanRequest& request) {
  if (request.workers < 1) throw std::invalid_argument("a plan needs at least one worker");
  if (!request.largest_batch && request.batch_size < 1) {
    throw std::invalid_argument(fmt::format("batch {} is not a batch", request.batch_size));
  }
  const size_t blocks = models::unet_blocks(depth_of(request.model)).size();
  if (costs.size() != blocks) {
    throw std::invalid_argument(fmt::format("{} block costs for {}, which has {} blocks",
                                            costs.size(), request.model, blocks));
  }
  StageTable table(costs, request);
  std::vector<Candidate> out = search(table, machine, request);
  if (out.empty()) throw NothingFits(nothing_fits(table, machine, request));
  rank(out, request.largest_batch);
  return out;
}

}  // namespace ferry::trainer
