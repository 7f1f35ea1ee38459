// How a plan reads: a candidate's description and `train` flags, the ranked table and the JSON
// document `plan --json` prints and `train --plan FILE` reads.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "trainer/image_size_json.h"
#include "trainer/planner.h"

namespace ferry::trainer {

std::vector<std::string> first_blocks(const std::vector<pipeline::Range>& cut,
                                      const std::vector<std::string>& block_names) {
  std::vector<std::string> out;
  for (const pipeline::Range& r : cut) out.push_back(block_names.at(static_cast<size_t>(r.begin)));
  return out;
}

std::string partition_of(const std::vector<std::string>& first_blocks) {
  if (first_blocks.size() < 2) return "";
  return fmt::format("{}", fmt::join(first_blocks.begin() + 1, first_blocks.end(), ","));
}

std::string Candidate::describe() const {
  std::string out = fmt::format("{} stage{}", stages, stages == 1 ? "" : "s");
  if (replicas > 1) out += fmt::format(" x {} replicas", replicas);
  out += schedule ? fmt::format(", {} x {}", pipeline::schedule_name(*schedule), microbatches)
                  : ", plain";
  if (recompute) out += ", recomputed";
  return out;
}

std::vector<std::string> Candidate::arguments(const PlanRequest& request,
                                              const std::vector<std::string>& block_names) const {
  std::vector<std::string> out = {
      "--model",      request.model,
      "--classes",    std::to_string(request.classes),
      "--image-size", request.image_size.text(),
      "--optimizer",  core::name_of(optimizer_names(), request.optimizer),
      "--batch-size", std::to_string(batch_size),
      "--stages",     std::to_string(stages)};
  auto add = [&out](std::initializer_list<std::string> words) {
    out.insert(out.end(), words.begin(), words.end());
  };
  if (stages > 1) add({"--partition", partition_of(first_blocks(cut, block_names))});
  if (replicas > 1) add({"--replicas", std::to_string(replicas)});
  if (schedule) {
    add({"--pipeline", pipeline::schedule_name(*schedule), "--microbatches",
         std::to_string(microbatches)});
  }
  if (recompute) add({"--checkpoint-activations"});
  if (!request.worker_budget_mib.empty()) {
    add({"--memory-budget-mib", fmt::format("{:.0f}", fmt::join(request.worker_budget_mib, ","))});
  } else if (request.budget_mib > 0) {
    add({"--memory-budget-mib", fmt::format("{:.0f}", request.budget_mib)});
  }
  return out;
}

std::string Candidate::flags(const PlanRequest& request,
                             const std::vector<std::string>& block_names) const {
  return fmt::format("{}", fmt::join(arguments(request, block_names), " "));
}

namespace {

// "2 stages, zb x 2: step 0.401 / 0.299 (+34%); slowest stage 0.310 / 0.228, optimizer 0.021 /
// 0.019, the rest 0.070 / 0.052; off the most: the slowest stage", for a verified candidate of
// more than one worker whose step was measured; empty otherwise.
std::string terms_line(const Candidate& c) {
  const StepTerms& m = c.measured_terms;
  const StepTerms& e = c.predicted_terms;
  if (!c.verified() || m.step_s <= 0 || e.step_s <= 0 || c.stages * c.replicas < 2) return "";
  const std::vector<std::pair<std::string, double>> off = {
      {"the slowest stage's compute", m.slowest_stage_s - e.slowest_stage_s},
      {"the optimizer's step", m.optimizer_s - e.optimizer_s},
      {"the rest (fill and drain, carries, all-reduce, the master)", m.rest_s() - e.rest_s()}};
  const auto most = std::max_element(off.begin(), off.end(), [](const auto& a, const auto& b) {
    return std::abs(a.second) < std::abs(b.second);
  });
  return fmt::format(
      "{}: step {:.3f} / {:.3f} ({:+.0f}%); slowest stage {:.3f} / {:.3f}, optimizer {:.3f} / "
      "{:.3f}, the rest {:.3f} / {:.3f}; off the most: {} ({:+.3f} s)",
      c.describe(), m.step_s, e.step_s, 100 * (m.step_s / e.step_s - 1), m.slowest_stage_s,
      e.slowest_stage_s, m.optimizer_s, e.optimizer_s, m.rest_s(), e.rest_s(), most->first,
      most->second);
}

}  // namespace

std::string candidates_table(const std::vector<Candidate>& candidates, size_t rows) {
  std::string out =
      fmt::format("{:>4} {:<38} {:>12} {:>10} {:>10} {:>9} {:>9}\n", "rank", "configuration",
                  "batch (est.)", "est. peak", "peak", "est. img/s", "img/s");
  for (size_t k = 0; k < candidates.size() && k < rows; ++k) {
    const Candidate& c = candidates[k];
    const std::string batch =
        c.predicted_batch_size > 0
            ? fmt::format("{} ({})", c.global_batch(), c.predicted_batch_size * c.replicas)
            : std::to_string(c.global_batch());
    out += fmt::format("{:>4} {:<38} {:>12} {:>10.0f} {:>10} {:>9.2f} {:>9}\n", k + 1, c.describe(),
                       batch, c.predicted_largest_peak_mib(),
                       c.verified() ? fmt::format("{:.0f}", c.measured_largest_peak_mib())
                                    : (c.verify_error.empty() ? "-" : "failed"),
                       c.predicted_images_per_s(),
                       c.verified() ? fmt::format("{:.2f}", c.measured_images_per_s) : "-");
  }
  std::string terms;
  for (size_t k = 0; k < candidates.size() && k < rows; ++k) {
    const std::string line = terms_line(candidates[k]);
    if (!line.empty()) terms += fmt::format("{:>4} {}\n", k + 1, line);
  }
  if (!terms.empty()) {
    out += "measured against estimated seconds per step, by term:\n" + terms;
  }
  return out;
}

nlohmann::ordered_json plan_document(const PlanRequest& request,
                                     const std::vector<std::string>& block_names,
                                     const std::vector<Candidate>& candidates,
                                     const Candidate& winner) {
  auto settings = [&](const Candidate& c) {
    nlohmann::ordered_json out{
        {"stages", c.stages},
        {"replicas", c.replicas},
        {"schedule", core::name_of(step_schedule_names(), c.schedule)},
        {"microbatches", c.microbatches},
        {"recompute", c.recompute},
        {"batch_size", c.batch_size},
        {"global_batch", c.global_batch()},
        {"predicted_global_batch",
         (c.predicted_batch_size > 0 ? c.predicted_batch_size : c.batch_size) * c.replicas},
        {"first_blocks", first_blocks(c.cut, block_names)},
        {"predicted_peak_mib", c.predicted_largest_peak_mib()},
        {"predicted_stage_peak_mib", c.predicted_peak_mib},
        {"predicted_images_per_s", c.predicted_images_per_s()},
        {"predicted_step_terms_s",
         {{"step", c.predicted_terms.step_s},
          {"slowest_stage", c.predicted_terms.slowest_stage_s},
          {"optimizer", c.predicted_terms.optimizer_s},
          {"rest", c.predicted_terms.rest_s()}}}};
    if (c.verified()) {
      out["measured_peak_mib"] = c.measured_largest_peak_mib();
      out["measured_stage_peak_mib"] = c.measured_peak_mib;
      out["measured_images_per_s"] = c.measured_images_per_s;
      if (c.measured_terms.step_s > 0) {
        out["measured_step_terms_s"] = {{"step", c.measured_terms.step_s},
                                        {"slowest_stage", c.measured_terms.slowest_stage_s},
                                        {"optimizer", c.measured_terms.optimizer_s},
                                        {"rest", c.measured_terms.rest_s()}};
      }
    } else if (!c.verify_error.empty()) {
      out["verify_error"] = c.verify_error;
    }
    return out;
  };
  nlohmann::ordered_json out;
  out["request"] = {{"model", request.model},
                    {"classes", request.classes},
                    {"image_size", request.image_size},
                    {"optimizer", core::name_of(optimizer_names(), request.optimizer)},
                    {"workers", request.workers},
                    {"memory_budget_mib", request.budget_mib},
                    {"worker_memory_budget_mib", request.worker_budget_mib},
                    {"batch_size", request.largest_batch ? 0 : request.batch_size},
                    {"largest_batch", request.largest_batch}};
  out["winner"] = settings(winner);
  out["winner"]["flags"] = winner.flags(request, block_names);
  out["candidates"] = nlohmann::ordered_json::array();
  for (const Candidate& c : candidates) out["candidates"].push_back(settings(c));
  return out;
}

}  // namespace ferry::trainer
