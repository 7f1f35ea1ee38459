// The timeline on its own, from hand-made spans: where it finds idle time, what it reports, and the
// trace it writes.
#include "ferry/pipeline/timeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>
#include <vector>

namespace ferry::pipeline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

Span on(int stage, SpanKind kind, int microbatch, double start_s, double end_s) {
  return {Timeline::compute_track(stage), kind, 0, microbatch, start_s, end_s};
}

std::vector<std::pair<double, double>> idle_of(const Timeline& timeline, int stage) {
  std::vector<std::pair<double, double>> out;
  for (const Span& span : timeline.spans()) {
    if (span.track == Timeline::compute_track(stage) && span.kind == SpanKind::Idle) {
      out.emplace_back(span.start_s, span.end_s);
    }
  }
  return out;
}

// Two stages, two micro-batches, over [0, 10]: stage 0 busy 0-4 and 6-8, stage 1 busy 2-8.
Timeline two_stage_step() {
  Timeline timeline("test", {"stage 0", "stage 1"}, 2);
  timeline.add_step({on(0, SpanKind::Forward, 0, 0, 2),
                     on(0, SpanKind::Forward, 1, 2, 4),
                     on(1, SpanKind::Forward, 0, 2, 4),
                     on(1, SpanKind::Forward, 1, 4, 5),
                     on(1, SpanKind::Backward, 1, 5, 6),
                     on(1, SpanKind::Backward, 0, 6, 8),
                     on(0, SpanKind::Backward, 1, 6, 7),
                     on(0, SpanKind::Backward, 0, 7, 8),
                     {Timeline::receive_track(1), SpanKind::Receive, 0, 0, 1, 2}},
                    0, 10);
  return timeline;
}

TEST(Timeline, IdleIsWhereAComputeTrackHasNothingBetweenTheStepsEnds) {
  Timeline timeline = two_stage_step();
  EXPECT_THAT(idle_of(timeline, 0), ElementsAre(Pair(4, 6), Pair(8, 10)));
  EXPECT_THAT(idle_of(timeline, 1), ElementsAre(Pair(0, 2), Pair(8, 10)));
}

TEST(Timeline, OverlappingBusySpansLeaveNoIdleBetweenThem) {
  Timeline timeline("test", {"stage 0"}, 1);
  timeline.add_step({on(0, SpanKind::Forward, 0, 1, 5), on(0, SpanKind::Send, 0, 3, 4),
                     on(0, SpanKind::Backward, 0, 6, 8)},
                    0, 8);
  EXPECT_THAT(idle_of(timeline, 0), ElementsAre(Pair(0, 1), Pair(5, 6)));
}

TEST(Timeline, ReportSumsEachKindPerStageAndSetsTheBubbleAgainstTheIdealOne) {
  Timeline timeline = two_stage_step();
  TimelineReport report = timeline.report();
  EXPECT_EQ(report.steps, 1);
  EXPECT_EQ(report.stages, 2);
  EXPECT_DOUBLE_EQ(report.wall_s, 10);
  ASSERT_EQ(report.per_stage.size(), 2u);
  EXPECT_EQ(report.per_stage[0].name, "stage 0");
  EXPECT_DOUBLE_EQ(report.per_stage[0].forward_s, 4);
  EXPECT_DOUBLE_EQ(report.per_stage[0].backward_s, 2);
  EXPECT_DOUBLE_EQ(report.per_stage[0].idle_s, 4);
  EXPECT_DOUBLE_EQ(report.per_stage[0].busy_share, 0.6);
  EXPECT_DOUBLE_EQ(report.per_stage[1].forward_s, 3);
  EXPECT_DOUBLE_EQ(report.per_stage[1].backward_s, 3);
  EXPECT_DOUBLE_EQ(report.bubble, 0.4);
  EXPECT_DOUBLE_EQ(report.ideal_bubble, 1.0 / 3);  // (p - 1) / (M + p - 1), p = M = 2
  EXPECT_THAT(timeline.table(), HasSubstr("measured 40% idle"));
}

TEST(Timeline, StepsAddUpAndIdleSpansCarryTheirStep) {
  Timeline timeline("test", {"stage 0"}, 1);
  timeline.add_step({on(0, SpanKind::Forward, 0, 0, 1)}, 0, 2);
  timeline.add_step({on(0, SpanKind::Forward, 0, 2, 4)}, 2, 4);
  EXPECT_EQ(timeline.steps(), 2);
  EXPECT_DOUBLE_EQ(timeline.report().wall_s, 4);
  EXPECT_DOUBLE_EQ(timeline.report().per_stage[0].busy_share, 0.75);
  std::vector<Span> idle;
  for (const Span& span : timeline.spans()) {
    if (span.kind == SpanKind::Idle) idle.push_back(span);
  }
  ASSERT_EQ(idle.size(), 1u);  // the second step has none
  EXPECT_EQ(idle[0].step, 0);
  EXPECT_DOUBLE_EQ(idle[0].start_s, 1);
}

TEST(Timeline, TheChromeTraceNamesEveryTrackAndHoldsEverySpanFromTheFirstStep) {
  Timeline timeline("a pipeline", {"stage 0: enc on a", "stage 1: dec on b"}, 2);
  timeline.add_step({on(0, SpanKind::Forward, 1, 100.5, 101)}, 100, 102);
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("ferry-timeline-" + std::to_string(::getpid()) + ".json");
  timeline.write_chrome_trace(path.string());
  nlohmann::json trace = nlohmann::json::parse(std::ifstream(path));
  std::filesystem::remove(path);

  std::map<int, std::string> tracks;
  std::vector<nlohmann::json> complete;
  for (const nlohmann::json& event : trace.at("traceEvents")) {
    if (event.at("ph") == "M" && event.at("name") == "thread_name") {
      tracks[event.at("tid").get<int>()] = event.at("args").at("name").get<std::string>();
    }
    if (event.at("ph") == "X") complete.push_back(event);
  }
  EXPECT_EQ(tracks[0], "master");
  EXPECT_EQ(tracks[Timeline::compute_track(1)], "stage 1: dec on b");
  EXPECT_EQ(tracks[Timeline::receive_track(0)], "stage 0 receives");
  ASSERT_EQ(complete.size(), timeline.spans().size());
  const nlohmann::json& forward = complete.front();
  EXPECT_EQ(forward.at("name"), "F1");
  EXPECT_EQ(forward.at("cat"), "forward");
  EXPECT_DOUBLE_EQ(forward.at("ts").get<double>(), 0.5e6);  // microseconds from the first step
  EXPECT_DOUBLE_EQ(forward.at("dur").get<double>(), 0.5e6);
  EXPECT_EQ(forward.at("args").at("micro-batch"), 1);
}

TEST(Timeline, ATraceThatCannotBeWrittenNamesItsPath) {
  Timeline timeline("test", {"stage 0"}, 1);
  try {
    timeline.write_chrome_trace("/nonexistent-ferry-dir/trace.json");
    FAIL() << "nothing was thrown";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent-ferry-dir/trace.json"));
  }
}

}  // namespace
}  // namespace ferry::pipeline
