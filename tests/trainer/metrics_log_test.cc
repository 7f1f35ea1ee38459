// The per-epoch CSV and its plot, written to a temporary folder as a run would.
#include "trainer/metrics_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "ferry/core/files.h"
#include "ferry/rpc/error.h"

namespace ferry::trainer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<std::string> kColumns = {"train_loss", "val_loss", "val_iou", "val_dice",
                                           "busy_encoder"};

std::string read(const std::string& path) { return core::read_whole_file(path); }

class MetricsLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ferry-metrics-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir() const { return (dir_ / "logs").string(); }

  std::filesystem::path dir_;
};

TEST_F(MetricsLogTest, WritesOneRowPerEpochUnderAHeaderAfterEveryEpoch) {
  MetricsLog log(dir(), kColumns);
  log.add({1, {0.9, 0.8, 0.25, 0.4, 0.5}});
  EXPECT_EQ(read(log.csv_path()),
            "epoch,train_loss,val_loss,val_iou,val_dice,busy_encoder\n1,0.9,0.8,0.25,0.4,0.5\n");
  log.add({2, {0.7, 0.6, 0.5, 0.625, 0.75}});
  std::vector<EpochFigures> rows = parse_metrics_csv(read(log.csv_path()), kColumns);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].epoch, 2);
  EXPECT_THAT(rows[1].values, ElementsAre(0.7, 0.6, 0.5, 0.625, 0.75));
}

TEST_F(MetricsLogTest, AResumedRunKeepsTheRowsUpToItsCheckpointAndRewritesTheRest) {
  {
    MetricsLog first(dir(), kColumns);
    for (int epoch = 1; epoch <= 3; ++epoch) first.add({epoch, {1.0 * epoch, 0, 0, 0, 0}});
  }
  MetricsLog resumed(dir(), kColumns);
  EXPECT_EQ(resumed.resume_after(2), "");
  ASSERT_EQ(resumed.rows().size(), 2u);
  resumed.add({3, {30, 0, 0, 0, 0}});
  std::vector<EpochFigures> rows = parse_metrics_csv(read(resumed.csv_path()), kColumns);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].values[0], 1.0);
  EXPECT_EQ(rows[2].values[0], 30.0);

  // A run that went back to epoch 1 (a worker lost) forgets the rows after it.
  resumed.truncate_after(1);
  resumed.add({2, {20, 0, 0, 0, 0}});
  rows = parse_metrics_csv(read(resumed.csv_path()), kColumns);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].values[0], 20.0);
}

TEST_F(MetricsLogTest, AFileOfAnotherRunIsNotResumedAndSaysWhy) {
  MetricsLog other(dir(), {"train_loss"});
  other.add({1, {0.5}});
  MetricsLog log(dir(), kColumns);
  std::string why = log.resume_after(1);
  EXPECT_THAT(why, HasSubstr("metrics.csv is not this run's"));
  EXPECT_THAT(why, HasSubstr("its header is \"epoch,train_loss\""));
  EXPECT_TRUE(log.rows().empty());

  std::filesystem::remove(log.csv_path());
  EXPECT_THAT(log.resume_after(1), HasSubstr("was not there"));
}

TEST(MetricsCsv, MissingValuesAreEmptyCellsAndBadLinesAreNamed) {
  std::string text = metrics_csv({"a", "b"}, {{4, {std::nan(""), 2.5}}});
  EXPECT_EQ(text, "epoch,a,b\n4,,2.5\n");
  std::vector<EpochFigures> back = parse_metrics_csv(text, {"a", "b"});
  ASSERT_EQ(back.size(), 1u);
  EXPECT_TRUE(std::isnan(back[0].values[0]));
  EXPECT_EQ(back[0].values[1], 2.5);

  try {
    parse_metrics_csv("epoch,a,b\n1,2,3\n2,x,3\n", {"a", "b"});
    FAIL() << "a cell that is no number was read";
  } catch (const rpc::Error& e) {
    EXPECT_EQ(e.kind(), rpc::ErrorKind::InvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("line 3 is not numbers: \"2,x,3\""));
  }
  try {
    parse_metrics_csv("epoch,a,b\n1,2\n", {"a", "b"});
    FAIL() << "a short line was read";
  } catch (const rpc::Error& e) {
    EXPECT_EQ(e.kind(), rpc::ErrorKind::InvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("line 2 has 2 cells, not 3"));
  }
}

TEST_F(MetricsLogTest, ARowOfTheWrongWidthIsRefused) {
  MetricsLog log(dir(), kColumns);
  try {
    log.add({1, {1, 2}});
    FAIL() << "a short row was written";
  } catch (const rpc::Error& e) {
    EXPECT_EQ(e.kind(), rpc::ErrorKind::InvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("a metrics row of 2 values for 5 columns"));
  }
}

// Counts the points of each polyline, in order.
std::vector<size_t> polyline_points(const std::string& svg) {
  std::vector<size_t> counts;
  std::regex polyline("<polyline points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), polyline);
       it != std::sregex_iterator(); ++it) {
    std::string points = (*it)[1];
    counts.push_back(points.empty() ? 0 : std::count(points.begin(), points.end(), ' ') + 1);
  }
  return counts;
}

TEST_F(MetricsLogTest, ThePlotHasACurvePerMetricWithAPointPerFiniteValue) {
  MetricsLog log(dir(), kColumns);
  log.add({1, {0.9, std::nan(""), 0.2, 0.3, 0.5}});
  log.add({2, {0.7, 0.6, 0.4, 0.5, 0.5}});
  log.add({3, {0.5, 0.4, 0.6, 0.7, 0.5}});
  log.write_plot("U-Net <ResNet-34> & friends");
  std::string svg = read(log.plot_path());
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_THAT(svg, HasSubstr("U-Net &lt;ResNet-34&gt; &amp; friends"));
  EXPECT_THAT(svg, HasSubstr(">train_loss</text>"));
  EXPECT_THAT(svg, HasSubstr(">val_dice</text>"));
  // train_loss, val_loss (its first epoch has none), val_iou, val_dice.
  EXPECT_THAT(polyline_points(svg), ElementsAre(3u, 2u, 3u, 3u));
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
}

TEST(MetricsSvg, APanelWithoutValuesSaysSo) {
  std::string svg = metrics_svg("t", {"train_loss"}, {}, {"train_loss"}, {"val_iou"});
  EXPECT_THAT(svg, HasSubstr("no finite values"));
  EXPECT_TRUE(polyline_points(svg).empty());
}

}  // namespace
}  // namespace ferry::trainer
