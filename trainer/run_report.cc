#include "trainer/run_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>

namespace ferry::trainer {
namespace {

using Json = nlohmann::ordered_json;

// JSON has no NaN.
Json figure(double x) { return std::isnan(x) ? Json() : Json(x); }
double figure_of(const nlohmann::json& j) { return j.is_null() ? std::nan("") : j.get<double>(); }

template <typename T>
void optional_to(Json& j, const char* key, const std::optional<T>& value) {
  if (value) j[key] = *value;
}

template <typename T>
void optional_from(const nlohmann::json& j, const char* key, std::optional<T>& value) {
  if (j.contains(key)) value = j.at(key).get<T>();
}

template <typename T>
void list_from(const nlohmann::json& j, const char* key, std::vector<T>& out) {
  if (j.contains(key)) out = j.at(key).get<std::vector<T>>();
}

}  // namespace

double RunReport::largest_stage_peak_mib() const {
  double out = 0;
  for (const StageRecord& stage : stages) out = std::max(out, stage.worker_peak_tensor_mib);
  return out;
}

void to_json(Json& j, const ClassFigures& c) {
  j = {{"iou", figure(c.iou)}, {"dice", figure(c.dice)}};
}

void to_json(Json& j, const EpochRecord& e) {
  j = {{"epoch", e.epoch},
       {"train_loss", e.train_loss},
       {"val_loss", e.val_loss},
       {"val_iou", e.val_iou},
       {"val_dice", e.val_dice},
       {"val_miou", e.val_miou},
       {"lr", e.lr},
       {"train_s", e.train_s},
       {"optimizer_s", e.optimizer_s},
       {"data_wait_s", e.data_wait_s},
       {"data_wait_share", e.data_wait_share},
       {"batches", e.batches},
       {"images_per_s", e.images_per_s},
       {"bytes_per_step", e.bytes_per_step},
       {"stage_compute_s", e.stage_compute_s}};
  if (e.classes.empty()) return;
  Json& classes = j["classes"] = Json::object();
  for (const ClassFigures& c : e.classes) classes[c.name] = c;
}

void to_json(Json& j, const RebalanceRecord& r) {
  j = Json::object();
  optional_to(j, "after_epoch", r.after_epoch);
  optional_to(j, "in_epoch", r.in_epoch);
  optional_to(j, "after_batch", r.after_batch);
  j["block_costs"] = r.block_costs;
  j["measured_slowest_s"] = r.measured_slowest_s;
  j["predicted_slowest_s"] = r.predicted_slowest_s;
  if (!r.blocks.empty()) j["blocks"] = r.blocks;
  j["moved"] = r.moved;
  if (!r.why_not.empty()) j["why_not"] = r.why_not;
  if (!r.handover.empty()) j["handover"] = r.handover;
  optional_to(j, "move_s", r.move_s);
  optional_to(j, "master_received_mib", r.master_received_mib);
}

void to_json(Json& j, const StageRecord& s) {
  j = {{"name", s.name},
       {"worker", s.worker},
       {"device", s.device},
       {"blocks", s.blocks},
       {"parameters", s.parameters},
       {"estimated_peak_mib", s.estimated_peak_mib},
       {"worker_peak_tensor_mib", s.worker_peak_tensor_mib},
       {"worker_peak_rss_mib", s.worker_peak_rss_mib},
       {"worker_device_copy_s", s.worker_device_copy_s},
       {"estimated_compute_s", s.estimated_compute_s}};
  optional_to(j, "measured_compute_s", s.measured_compute_s);
}

void to_json(Json& j, const BlockRecord& b) {
  j = {{"block", b.block},
       {"estimated_compute_s", b.estimated_compute_s},
       {"measured_compute_s", b.measured_compute_s}};
}

void to_json(Json& j, const PipelineRecord& p) {
  j = {{"schedule", p.schedule},
       {"microbatches", p.microbatches},
       {"bubble", p.bubble},
       {"ideal_bubble", p.ideal_bubble}};
}

void to_json(Json& j, const BucketRecord& b) {
  j = {{"worker", b.worker},
       {"replica", b.replica},
       {"buckets", b.buckets},
       {"mib", b.mib},
       {"started_in_backward", b.started_in_backward},
       {"started_at_step", b.started_at_step},
       {"late_rounds", b.late_rounds},
       {"waited_s", b.waited_s}};
}

void to_json(Json& j, const RunReport& r) {
  j = {{"epochs", r.epochs},
       {"rebalances", r.rebalances},
       {"takeovers", r.takeovers},
       {"replicas", r.replicas}};
  if (r.best) {
    j["monitor"] = r.best->monitor;
    j["best_epoch"] = r.best->best_epoch;
    j["best_value"] = r.best->best_value;
    if (!r.best->best_checkpoint.empty()) j["best_checkpoint"] = r.best->best_checkpoint;
    if (r.best->stopped_after_epoch > 0) j["stopped_after_epoch"] = r.best->stopped_after_epoch;
  }
  optional_to(j, "pipeline", r.pipeline);
  j["stages"] = r.stages;
  j["blocks"] = r.blocks;
  if (!r.gradient_buckets.empty()) j["gradient_buckets"] = r.gradient_buckets;
  optional_to(j, "single_process_peak_mib", r.single_process_peak_mib);
  j["train_s"] = r.train_s;
  j["data_wait_s"] = r.data_wait_s;
  j["data_wait_share"] = r.data_wait_share;
}

void from_json(const nlohmann::json& j, EpochRecord& e) {
  e.epoch = j.at("epoch").get<int>();
  e.train_loss = figure_of(j.at("train_loss"));
  e.val_loss = figure_of(j.at("val_loss"));
  e.val_iou = figure_of(j.at("val_iou"));
  e.val_dice = figure_of(j.at("val_dice"));
  e.val_miou = figure_of(j.at("val_miou"));
  e.lr = j.at("lr").get<double>();
  e.train_s = j.at("train_s").get<double>();
  e.optimizer_s = j.at("optimizer_s").get<double>();
  e.data_wait_s = j.at("data_wait_s").get<double>();
  e.data_wait_share = j.at("data_wait_share").get<double>();
  e.batches = j.at("batches").get<std::size_t>();
  e.images_per_s = j.at("images_per_s").get<double>();
  e.bytes_per_step = j.at("bytes_per_step").get<double>();
  e.stage_compute_s = j.at("stage_compute_s").get<std::vector<double>>();
  e.classes.clear();
  if (!j.contains("classes")) return;
  for (const auto& [name, c] : j.at("classes").items()) {
    e.classes.push_back({name, figure_of(c.at("iou")), figure_of(c.at("dice"))});
  }
}

void from_json(const nlohmann::json& j, RebalanceRecord& r) {
  optional_from(j, "after_epoch", r.after_epoch);
  optional_from(j, "in_epoch", r.in_epoch);
  optional_from(j, "after_batch", r.after_batch);
  r.block_costs = j.at("block_costs").get<std::string>();
  r.measured_slowest_s = j.at("measured_slowest_s").get<double>();
  r.predicted_slowest_s = j.at("predicted_slowest_s").get<double>();
  r.blocks = j.value("blocks", std::string());
  r.moved = j.at("moved").get<bool>();
  r.why_not = j.value("why_not", std::string());
  r.handover = j.value("handover", std::string());
  optional_from(j, "move_s", r.move_s);
  optional_from(j, "master_received_mib", r.master_received_mib);
}

void from_json(const nlohmann::json& j, StageRecord& s) {
  s.name = j.at("name").get<std::string>();
  s.worker = j.at("worker").get<std::string>();
  s.device = j.at("device").get<std::string>();
  s.blocks = j.at("blocks").get<std::string>();
  s.parameters = j.at("parameters").get<std::int64_t>();
  s.estimated_peak_mib = j.at("estimated_peak_mib").get<double>();
  s.worker_peak_tensor_mib = j.at("worker_peak_tensor_mib").get<double>();
  s.worker_peak_rss_mib = j.at("worker_peak_rss_mib").get<double>();
  s.worker_device_copy_s = j.at("worker_device_copy_s").get<double>();
  s.estimated_compute_s = j.at("estimated_compute_s").get<double>();
  optional_from(j, "measured_compute_s", s.measured_compute_s);
}

void from_json(const nlohmann::json& j, BlockRecord& b) {
  b.block = j.at("block").get<std::string>();
  b.estimated_compute_s = j.at("estimated_compute_s").get<double>();
  b.measured_compute_s = j.at("measured_compute_s").get<double>();
}

void from_json(const nlohmann::json& j, PipelineRecord& p) {
  p.schedule = j.at("schedule").get<std::string>();
  p.microbatches = j.at("microbatches").get<int>();
  p.bubble = j.at("bubble").get<double>();
  p.ideal_bubble = j.at("ideal_bubble").get<double>();
}

void from_json(const nlohmann::json& j, BucketRecord& b) {
  b.worker = j.at("worker").get<std::string>();
  b.replica = j.at("replica").get<int>();
  b.buckets = j.at("buckets").get<std::int64_t>();
  b.mib = j.at("mib").get<double>();
  b.started_in_backward = j.at("started_in_backward").get<std::int64_t>();
  b.started_at_step = j.at("started_at_step").get<std::int64_t>();
  b.late_rounds = j.at("late_rounds").get<std::int64_t>();
  b.waited_s = j.at("waited_s").get<double>();
}

void from_json(const nlohmann::json& j, RunReport& r) {
  r = RunReport{};
  r.epochs = j.at("epochs").get<std::vector<EpochRecord>>();
  list_from(j, "rebalances", r.rebalances);
  r.takeovers = j.at("takeovers").get<int>();
  r.replicas = j.at("replicas").get<int>();
  if (j.contains("monitor")) {
    BestRecord best;
    best.monitor = j.at("monitor").get<std::string>();
    best.best_epoch = j.at("best_epoch").get<int>();
    best.best_value = j.at("best_value").get<double>();
    best.best_checkpoint = j.value("best_checkpoint", std::string());
    best.stopped_after_epoch = j.value("stopped_after_epoch", 0);
    r.best = best;
  }
  optional_from(j, "pipeline", r.pipeline);
  r.stages = j.at("stages").get<std::vector<StageRecord>>();
  list_from(j, "blocks", r.blocks);
  list_from(j, "gradient_buckets", r.gradient_buckets);
  optional_from(j, "single_process_peak_mib", r.single_process_peak_mib);
  r.train_s = j.at("train_s").get<double>();
  r.data_wait_s = j.at("data_wait_s").get<double>();
  r.data_wait_share = j.at("data_wait_share").get<double>();
}

RunReport read_run_report(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("cannot open the run's report \"{}\"", path));
  try {
    return nlohmann::json::parse(in).get<RunReport>();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(
        fmt::format("\"{}\" is not a run's report (--metrics-file): {}", path, e.what()));
  }
}

}  // namespace ferry::trainer
