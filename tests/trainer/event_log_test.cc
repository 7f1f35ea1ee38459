// A job's --events file: lines written whole, from any thread, appended to by a resumed run, and
// read back as the job's course by a program watching from outside.
#include "trainer/event_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <thread>
#include <vector>

#include "ferry/rpc/error.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"

namespace ferry::trainer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(EventLog, LinesFromSeveralThreadsStayWholeAndAResumedRunAppends) {
  ferry::testing::TempDir dir("events");
  const std::string path = dir.path() + "/events.jsonl";
  {
    EventLog events(path);
    events.add("start", {{"epochs", 2}});
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&events, t] {
        for (int i = 0; i < 50; ++i) events.add("checkpoint", {{"thread", t}, {"i", i}});
      });
    }
    for (std::thread& t : threads) t.join();
  }
  EventLog(path).add("resume", {{"step", 3}});
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 1u + 200u + 1u);
  EXPECT_EQ(lines.front().at("event"), "start");
  EXPECT_EQ(lines.front().at("epochs"), 2);
  EXPECT_GE(lines.front().at("time").get<double>(), 0);
  EXPECT_GT(lines.front().at("unix_time").get<double>(), 1.6e9);
  EXPECT_EQ(lines.back().at("event"), "resume");
}

TEST(EventLog, AFileThatCannotBeOpenedIsNamedAndNoFileWritesNothing) {
  EXPECT_THAT(ferry::testing::error_of([] { EventLog("/nonexistent-dir/events.jsonl"); }),
              HasSubstr("--events: cannot open \"/nonexistent-dir/events.jsonl\""));
  EventLog none("");
  none.add("step", {{"step", 1}});  // nowhere, and no failure
}

TEST(JobCourse, StepsTakeoversAndResumesAreReadInOrderAndAHalfWrittenLineWaits) {
  ferry::testing::TempDir dir("events");
  const std::string path = dir.path() + "/events.jsonl";
  EXPECT_EQ(read_job_course(path).steps_seen, 0);  // not there yet
  {
    EventLog events(path);
    events.add("start");
    for (int step = 1; step <= 5; ++step) events.add("step", {{"step", step}});
    events.add("worker_lost", {{"workers", {"worker2"}}});
    events.add("takeover",
               {{"taken", {{{"lost", "worker2"}, {"spare", "worker5"}, {"stages", {"stage1"}}}}},
                {"step", 4},
                {"steps_lost", 1}});
    events.add("step", {{"step", 5}});
    events.add("resume", {{"step", 5}});
    events.add("end");
  }
  std::ofstream(path, std::ios::app) << R"({"event":"step","st)";
  const JobCourse course = read_job_course(path);
  EXPECT_EQ(course.steps_seen, 6);
  EXPECT_EQ(course.step, 5);
  ASSERT_EQ(course.takeovers.size(), 1u);
  ASSERT_EQ(course.takeovers[0].size(), 1u);
  EXPECT_EQ(course.takeovers[0][0].lost, "worker2");
  EXPECT_EQ(course.takeovers[0][0].spare, "worker5");
  EXPECT_THAT(course.takeover_steps_lost, ElementsAre(1));
  EXPECT_THAT(course.resumed_at, ElementsAre(5));
  EXPECT_EQ(course.ends, 1);
}

}  // namespace
}  // namespace ferry::trainer
