// A run's report as --metrics-file writes it and the planner and benchmarks read it: every field
// survives the file, fields a run did not have stay out of it, a class found nowhere is null,
// and a file that is not a report is an error naming it.
#include "trainer/run_report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <stdexcept>

#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"

namespace ferry::trainer {
namespace {

using ::testing::HasSubstr;

// A report with every field set, as a pipelined job of two replicas with classes, a monitor, a
// moved cut and --compare-single-process writes it.
RunReport full_report() {
  RunReport r;
  EpochRecord epoch;
  epoch.epoch = 1;
  epoch.train_loss = 0.5;
  epoch.val_loss = 0.4;
  epoch.val_iou = 0.6;
  epoch.val_dice = 0.7;
  epoch.val_miou = 0.65;
  epoch.lr = 0.003;
  epoch.train_s = 12.5;
  epoch.optimizer_s = 0.25;
  epoch.data_wait_s = 0.125;
  epoch.data_wait_share = 0.01;
  epoch.batches = 40;
  epoch.images_per_s = 25.5;
  epoch.bytes_per_step = 1048576.5;
  epoch.stage_compute_s = {0.125, 0.25};
  epoch.classes = {{"background", 0.9, 0.95}, {"ellipse", 0.5, 0.625}, {"polygon", NAN, NAN}};
  r.epochs = {epoch, epoch};
  r.epochs[1].epoch = 2;
  r.epochs[1].classes.clear();
  RebalanceRecord moved;
  moved.in_epoch = 1;
  moved.after_batch = 5;
  moved.block_costs = "measured in the stages";
  moved.measured_slowest_s = 0.5;
  moved.predicted_slowest_s = 0.375;
  moved.blocks = "layer4.1 from stage0 to stage1";
  moved.moved = true;
  moved.handover = "worker to worker";
  moved.move_s = 1.5;
  moved.master_received_mib = 0.25;
  RebalanceRecord kept;
  kept.after_epoch = 1;
  kept.block_costs = "estimated";
  kept.why_not = "the best cut is the one the job has";
  r.rebalances = {moved, kept};
  r.takeovers = 1;
  r.replicas = 2;
  r.best = BestRecord{"val_iou", 2, 0.6, "/tmp/c/best/ckpt-1", 3};
  r.pipeline = PipelineRecord{"zb", 4, 0.125, 0.0625};
  StageRecord stage;
  stage.name = "stage0";
  stage.worker = "worker1";
  stage.device = "cpu";
  stage.blocks = "stem..layer4.1";
  stage.parameters = 11176512;
  stage.estimated_peak_mib = 180.5;
  stage.worker_peak_tensor_mib = 183.25;
  stage.worker_peak_rss_mib = 421;
  stage.worker_device_copy_s = 0;
  stage.estimated_compute_s = 0.0625;
  stage.measured_compute_s = 0.125;
  r.stages = {stage};
  r.blocks = {{"stem", 0.01, 0.02}};
  r.gradient_buckets = {{"worker1", 0, 3, 42.5, 5, 1, 0, 0.125}};
  r.single_process_peak_mib = 512;
  r.train_s = 25;
  r.data_wait_s = 0.25;
  r.data_wait_share = 0.01;
  return r;
}

std::string text_of(const RunReport& r) { return nlohmann::ordered_json(r).dump(2); }

TEST(RunReport, EveryFieldSurvivesTheFileAndAbsentOnesStayOut) {
  ferry::testing::TempDir dir("run_report");
  const RunReport written = full_report();
  const std::string path = dir.path() + "/metrics.json";
  std::ofstream(path) << text_of(written);
  const RunReport read = read_run_report(path);
  EXPECT_EQ(text_of(read), text_of(written));
  ASSERT_EQ(read.epochs.size(), 2u);
  ASSERT_EQ(read.epochs[0].classes.size(), 3u);
  EXPECT_EQ(read.epochs[0].classes[1].name, "ellipse");
  EXPECT_TRUE(std::isnan(read.epochs[0].classes[2].iou));
  EXPECT_EQ(read.rebalances[0].after_batch, 5u);
  EXPECT_FALSE(read.rebalances[1].move_s.has_value());
  EXPECT_EQ(read.best->stopped_after_epoch, 3);
  EXPECT_EQ(read.largest_stage_peak_mib(), 183.25);

  const nlohmann::json file = nlohmann::json::parse(text_of(written));
  EXPECT_TRUE(file["epochs"][0]["classes"]["polygon"]["iou"].is_null());
  EXPECT_FALSE(file["epochs"][1].contains("classes"));
  EXPECT_FALSE(file["rebalances"][1].contains("in_epoch"));
  EXPECT_FALSE(file["rebalances"][1].contains("handover"));
  EXPECT_EQ(file["rebalances"][1]["why_not"], "the best cut is the one the job has");

  // A plain job of one copy without a monitor: none of their fields.
  RunReport plain = full_report();
  plain.best.reset();
  plain.pipeline.reset();
  plain.gradient_buckets.clear();
  plain.single_process_peak_mib.reset();
  plain.rebalances.clear();
  const nlohmann::json plain_file = nlohmann::json::parse(text_of(plain));
  for (const char* key :
       {"monitor", "best_epoch", "pipeline", "gradient_buckets", "single_process_peak_mib"}) {
    EXPECT_FALSE(plain_file.contains(key)) << key;
  }
  EXPECT_TRUE(plain_file["rebalances"].is_array());
  std::ofstream(path) << plain_file.dump();
  EXPECT_EQ(text_of(read_run_report(path)), text_of(plain));
}

TEST(RunReport, AFileThatIsNotAReportNamesItselfAndWhatIsMissing) {
  ferry::testing::TempDir dir("run_report");
  const std::string path = dir.path() + "/metrics.json";
  EXPECT_THAT(ferry::testing::error_of([&] { read_run_report(path); }),
              HasSubstr("cannot open the run's report \"" + path + "\""));
  nlohmann::json broken = nlohmann::json::parse(text_of(full_report()));
  broken["stages"][0].erase("worker_peak_tensor_mib");
  std::ofstream(path) << broken.dump();
  const std::string error = ferry::testing::error_of([&] { read_run_report(path); });
  EXPECT_THAT(error, HasSubstr("\"" + path + "\" is not a run's report"));
  EXPECT_THAT(error, HasSubstr("worker_peak_tensor_mib"));
}

}  // namespace
}  // namespace ferry::trainer
