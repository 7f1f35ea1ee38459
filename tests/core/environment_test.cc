// Settings from environment variables, read one way (ferry/core/environment.h).
#include "ferry/core/environment.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <stdexcept>

#include "ferry/core/log.h"
#include "tests/support/error_of.h"

namespace ferry::core {
namespace {

using ferry::testing::error_of;
using ::testing::HasSubstr;

// Every FERRY_* number is read by the same parser, so each bad value is an error that names its
// variable, where the tensor cache once took "12x" as the default without a word.
TEST(Environment, ANumberVariableIsUnsetParsedOrAnErrorNamingIt) {
  ::unsetenv("FERRY_TEST_NUMBER");
  EXPECT_EQ(whole_number_from_environment("FERRY_TEST_NUMBER", 0), std::nullopt);
  ::setenv("FERRY_TEST_NUMBER", "", 1);
  EXPECT_EQ(whole_number_from_environment("FERRY_TEST_NUMBER", 0), std::nullopt);
  ::setenv("FERRY_TEST_NUMBER", "512", 1);
  EXPECT_EQ(whole_number_from_environment("FERRY_TEST_NUMBER", 0), 512);
  for (const char* bad : {"12x", "-1", " 3", "1e3", "99999999999999999999"}) {
    ::setenv("FERRY_TEST_NUMBER", bad, 1);
    try {
      whole_number_from_environment("FERRY_TEST_NUMBER", 0, "MiB");
      ADD_FAILURE() << bad << " was taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr(fmt::format("FERRY_TEST_NUMBER=\"{}\" is not a whole, "
                                                  "non-negative number of MiB",
                                                  bad)));
    }
  }
  ::unsetenv("FERRY_TEST_NUMBER");
  EXPECT_THAT(error_of([] { parse_whole_number("MASTER_PORT", "0", 1, "", 65535); }),
              HasSubstr("MASTER_PORT=\"0\" is not a whole, positive number up to 65535"));
}

TEST(Environment, ALogLevelIsCheckedWhereTheAgentStartsAndNeverThrowsFromALogCall) {
  EXPECT_EQ(log::level_named("WARN"), log::Level::Warn);
  EXPECT_EQ(log::level_named("loud"), std::nullopt);
  ::setenv("FERRY_LOG_LEVEL", "loud", 1);
  EXPECT_THAT(error_of([] { check_log_level_in_environment(); }),
              HasSubstr("FERRY_LOG_LEVEL=\"loud\" is not one of trace, debug, info, warn"));
  // A log call under the bad level neither throws nor is lost: it logs at info meanwhile.
  ::testing::internal::CaptureStderr();
  EXPECT_NO_THROW(log::warn("logged under FERRY_LOG_LEVEL={}", "loud"));
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              HasSubstr("logged under FERRY_LOG_LEVEL=loud"));
  ::setenv("FERRY_LOG_LEVEL", "debug", 1);
  EXPECT_NO_THROW(check_log_level_in_environment());
  ::unsetenv("FERRY_LOG_LEVEL");
}

}  // namespace
}  // namespace ferry::core
