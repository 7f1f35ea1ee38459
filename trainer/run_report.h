// What a training run reports: its epochs, re-balances, stages, blocks, pipeline, gradient
// buckets and best epoch, as `--metrics-file` writes them. The job fills one RunReport as it
// runs; the planner's checks and the benchmarks read it back from the file. Value types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace ferry::trainer {

// One class's figures on the validation set; NaN (null in JSON) where the class was found in
// neither the masks nor the predictions.
struct ClassFigures {
  std::string name;
  double iou = 0, dice = 0;
};

struct EpochRecord {
  int epoch = 0;
  double train_loss = 0, val_loss = 0, val_iou = 0, val_dice = 0, val_miou = 0, lr = 0;
  double train_s = 0, optimizer_s = 0, data_wait_s = 0, data_wait_share = 0;
  std::size_t batches = 0;
  double images_per_s = 0, bytes_per_step = 0;
  std::vector<double> stage_compute_s;  // per stage, per step
  std::vector<ClassFigures> classes;    // with more than one class
};

// A look at the cut: when (after an epoch, or within one after a batch), what it measured and
// predicted, and whether the blocks moved and how, or why not.
struct RebalanceRecord {
  std::optional<int> after_epoch, in_epoch;
  std::optional<std::size_t> after_batch;
  std::string block_costs;  // "measured in the stages" or "estimated"
  double measured_slowest_s = 0, predicted_slowest_s = 0;
  std::string blocks;  // the move, "layer4.1 from stage0 to stage1"; empty when none was found
  bool moved = false;
  std::string why_not;   // when it did not move
  std::string handover;  // when it moved: "worker to worker" or "through the master"
  std::optional<double> move_s, master_received_mib;
};

struct StageRecord {
  std::string name, worker, device;
  std::string blocks;  // "stem..layer4.1"
  std::int64_t parameters = 0;
  double estimated_peak_mib = 0, worker_peak_tensor_mib = 0, worker_peak_rss_mib = 0;
  double worker_device_copy_s = 0;
  double estimated_compute_s = 0;
  std::optional<double> measured_compute_s;  // per step over the run
};

struct BlockRecord {
  std::string block;
  double estimated_compute_s = 0, measured_compute_s = 0;
};

struct PipelineRecord {
  std::string schedule;
  int microbatches = 0;
  double bubble = 0, ideal_bubble = 0;
};

// One owner's gradient buckets, with replicas.
struct BucketRecord {
  std::string worker;
  int replica = 0;
  std::int64_t buckets = 0;
  double mib = 0;
  std::int64_t started_in_backward = 0, started_at_step = 0, late_rounds = 0;
  double waited_s = 0;
};

// The end of a run by its monitored metric.
struct BestRecord {
  std::string monitor;
  int best_epoch = 0;
  double best_value = 0;
  std::string best_checkpoint;  // empty: none was kept
  int stopped_after_epoch = 0;  // 0: the run did not stop early
};

struct RunReport {
  std::vector<EpochRecord> epochs;
  std::vector<RebalanceRecord> rebalances;
  int takeovers = 0;
  int replicas = 1;
  std::optional<BestRecord> best;
  std::optional<PipelineRecord> pipeline;  // pipelined steps
  std::vector<StageRecord> stages;         // replica 0's
  std::vector<BlockRecord> blocks;         // when the stages time their blocks
  std::vector<BucketRecord> gradient_buckets;
  std::optional<double> single_process_peak_mib;  // --compare-single-process
  double train_s = 0, data_wait_s = 0, data_wait_share = 0;

  // The largest of the stages' worker tensor peaks (0 without stages).
  double largest_stage_peak_mib() const;
};

void to_json(nlohmann::ordered_json& j, const ClassFigures& c);
void to_json(nlohmann::ordered_json& j, const EpochRecord& e);
void to_json(nlohmann::ordered_json& j, const RebalanceRecord& r);
void to_json(nlohmann::ordered_json& j, const StageRecord& s);
void to_json(nlohmann::ordered_json& j, const BlockRecord& b);
void to_json(nlohmann::ordered_json& j, const PipelineRecord& p);
void to_json(nlohmann::ordered_json& j, const BucketRecord& b);
void to_json(nlohmann::ordered_json& j, const RunReport& r);

void from_json(const nlohmann::json& j, EpochRecord& e);
void from_json(const nlohmann::json& j, RebalanceRecord& r);
void from_json(const nlohmann::json& j, StageRecord& s);
void from_json(const nlohmann::json& j, BlockRecord& b);
void from_json(const nlohmann::json& j, PipelineRecord& p);
void from_json(const nlohmann::json& j, BucketRecord& b);
void from_json(const nlohmann::json& j, RunReport& r);

// The report `path` holds (a job's --metrics-file). Throws std::runtime_error naming the file and
// what in it was missing or wrong.
RunReport read_run_report(const std::string& path);

}  // namespace ferry::trainer
