// Lists split at their separator, every part kept, empty ones too.
#include "ferry/core/text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ferry::core {
namespace {

using ::testing::ElementsAre;

TEST(Split, KeepsEveryPartEmptyOnesToo) {
  EXPECT_THAT(split("flip,rot90", ','), ElementsAre("flip", "rot90"));
  EXPECT_THAT(split("a,,b,", ','), ElementsAre("a", "", "b", ""));
  EXPECT_THAT(split("", ','), ElementsAre(""));
  EXPECT_THAT(split("ce;ignore_index=255", ';'), ElementsAre("ce", "ignore_index=255"));
}

}  // namespace
}  // namespace ferry::core
