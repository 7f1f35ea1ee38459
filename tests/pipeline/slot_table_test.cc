// The table of a worker's pipeline stages, without processes.
#include "pipeline/slot_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "tests/support/error_of.h"

namespace ferry::pipeline {
namespace {

using ferry::testing::kind_and_error_of;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<std::string> names(const std::vector<std::shared_ptr<std::string>>& slots) {
  std::vector<std::string> out;
  for (const auto& slot : slots) out.push_back(*slot);
  return out;
}

TEST(SlotTable, FindsAStageByPipelineAndIndexOrSaysWhereItIsMissing) {
  SlotTable<std::string> table;
  table.put(7, 1, std::make_shared<std::string>("7/1"));
  table.put(7, 0, std::make_shared<std::string>("7/0"));
  table.put(8, 0, std::make_shared<std::string>("8/0"));
  EXPECT_EQ(*table.at(7, 1, "w"), "7/1");
  EXPECT_EQ(kind_and_error_of([&] { table.at(7, 2, "worker3"); }),
            "InvalidArgument: stage 2 of pipeline 7 is not set up on worker \"worker3\"");
  // Set up again: the new slot replaces the old.
  table.put(7, 1, std::make_shared<std::string>("7/1 again"));
  EXPECT_EQ(*table.at(7, 1, "w"), "7/1 again");
}

TEST(SlotTable, ListsAndForgetsOnePipelineWithoutTouchingItsNeighbours) {
  SlotTable<std::string> table;
  const std::int64_t low = std::numeric_limits<std::int64_t>::min();
  const std::int64_t high = std::numeric_limits<std::int64_t>::max();
  for (std::int64_t pipeline : {low, std::int64_t{4}, std::int64_t{5}, high}) {
    for (std::int64_t index : {1, 0}) {
      table.put(
          pipeline, index,
          std::make_shared<std::string>(std::to_string(pipeline) + "/" + std::to_string(index)));
    }
  }
  EXPECT_THAT(names(table.of(5)), ElementsAre("5/0", "5/1"));
  EXPECT_THAT(names(table.of(6)), IsEmpty());
  EXPECT_EQ(table.all().size(), 8u);
  std::shared_ptr<std::string> kept = table.at(5, 0, "w");
  table.erase(5);
  EXPECT_THAT(names(table.of(5)), IsEmpty());
  EXPECT_THAT(names(table.of(4)), ElementsAre("4/0", "4/1"));
  EXPECT_EQ(*kept, "5/0");  // a stage in use lives on
  table.erase(high);
  table.erase(low);
  EXPECT_THAT(names(table.all()), ElementsAre("4/0", "4/1"));
}

}  // namespace
}  // namespace ferry::pipeline
