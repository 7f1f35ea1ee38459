// Running a program by its argument vector: its output kept, its environment changed as asked,
// its exit status, and a program that cannot start.
#include "ferry/core/processes.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

namespace ferry::core {
namespace {

using ::testing::HasSubstr;

TEST(RunProcess, KeepsWhatItPrintsWithItsArgumentsAsGiven) {
  // One argument with a space and a quote: no shell splits or reads it.
  const CommandOutput out =
      run_process({"/bin/echo", "two words", "it's"}, ChildEnvironment{}, true);
  EXPECT_EQ(out.status, 0);
  EXPECT_EQ(out.output, "two words it's\n");
}

TEST(RunProcess, SetsAndRemovesVariablesAndKeepsTheRest) {
  ::setenv("FERRY_TEST_KEPT", "kept", 1);
  ::setenv("FERRY_TEST_GONE", "gone", 1);
  ::setenv("FERRY_TEST_OVER", "old", 1);
  const CommandOutput out = run_process(
      {"/bin/sh", "-c",
       "echo \"$FERRY_TEST_KEPT/${FERRY_TEST_GONE-unset}/$FERRY_TEST_OVER/$FERRY_TEST_NEW\""},
      ChildEnvironment{{{"FERRY_TEST_OVER", "new"}, {"FERRY_TEST_NEW", "added"}},
                       {"FERRY_TEST_GONE"}});
  EXPECT_EQ(out.status, 0);
  EXPECT_EQ(out.last_line(), "kept/unset/new/added");
}

TEST(RunProcess, GivesTheExitStatusAndItsErrorsOnlyWhenAsked) {
  const std::vector<std::string> command = {"/bin/sh", "-c", "echo out; echo err >&2; exit 3"};
  const CommandOutput both = run_process(command, {}, true);
  EXPECT_EQ(both.status, 3);
  EXPECT_THAT(both.output, HasSubstr("err"));
  const CommandOutput out = run_process(command, {}, false);
  EXPECT_EQ(out.status, 3);
  EXPECT_EQ(out.output, "out\n");
}

TEST(RunProcess, AProgramThatCannotStartSaysWhich) {
  const CommandOutput out = run_process({"/nonexistent/ferry-program"}, {});
  EXPECT_NE(out.status, 0);
  EXPECT_THAT(out.output, HasSubstr("/nonexistent/ferry-program"));
}

}  // namespace
}  // namespace ferry::core
