// The order a stage's requests start in: micro-batch order within a step, whatever order they
// arrive in; older and discarded steps' requests abandoned; repeats and negative micro-batches
// refused.
#include "pipeline/in_order.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ferry/rpc/error.h"

namespace ferry::pipeline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(InOrder, LetsRequestsThroughInMicroBatchOrderWhateverTheirArrival) {
  InOrder<std::string> order;
  std::vector<std::string> abandoned;
  EXPECT_THAT(order.take(7, 2, "m2", &abandoned), IsEmpty());
  EXPECT_THAT(order.take(7, 1, "m1", &abandoned), IsEmpty());
  EXPECT_EQ(order.waiting(), 2u);
  EXPECT_THAT(order.take(7, 0, "m0", &abandoned), ElementsAre("m0", "m1", "m2"));
  EXPECT_THAT(order.take(7, 3, "m3", &abandoned), ElementsAre("m3"));
  EXPECT_EQ(order.waiting(), 0u);
  EXPECT_THAT(abandoned, IsEmpty());
}

TEST(InOrder, ANewerStepAbandonsTheOlderOnesWaitingAndLateRequests) {
  InOrder<std::string> order;
  std::vector<std::string> abandoned;
  EXPECT_THAT(order.take(7, 1, "old m1", &abandoned), IsEmpty());
  EXPECT_THAT(order.take(8, 0, "new m0", &abandoned), ElementsAre("new m0"));
  EXPECT_THAT(abandoned, ElementsAre("old m1"));
  EXPECT_THAT(order.take(7, 0, "old m0", &abandoned), IsEmpty());
  EXPECT_THAT(abandoned, ElementsAre("old m1", "old m0"));
}

TEST(InOrder, ADiscardedStepFailsWhatWaitsAndWhatComesLater) {
  InOrder<std::string> order;
  std::vector<std::string> abandoned;
  EXPECT_THAT(order.take(7, 0, "m0", &abandoned), ElementsAre("m0"));
  EXPECT_THAT(order.take(7, 2, "m2", &abandoned), IsEmpty());
  EXPECT_FALSE(order.discarded(7));
  order.abandon(&abandoned);
  EXPECT_THAT(abandoned, ElementsAre("m2"));
  // m0, let through before, is told so when it ends: it must keep nothing.
  EXPECT_TRUE(order.discarded(7));
  EXPECT_THAT(order.take(7, 1, "m1", &abandoned), IsEmpty());
  EXPECT_THAT(abandoned, ElementsAre("m2", "m1"));
  // The next step starts afresh; the discarded one stays discarded.
  EXPECT_THAT(order.take(8, 0, "next m0", &abandoned), ElementsAre("next m0"));
  EXPECT_FALSE(order.discarded(8));
  EXPECT_TRUE(order.discarded(7));
}

TEST(InOrder, RepeatedAndNegativeMicroBatchesAreRefused) {
  InOrder<std::string> order;
  std::vector<std::string> abandoned;
  order.take(7, 0, "m0", &abandoned);
  order.take(7, 2, "m2", &abandoned);
  for (std::int64_t microbatch : {0, 2}) {
    try {
      order.take(7, microbatch, "again", &abandoned);
      ADD_FAILURE() << "micro-batch " << microbatch << " was taken twice";
    } catch (const rpc::Error& e) {
      EXPECT_EQ(e.kind(), rpc::ErrorKind::InvalidArgument);
      EXPECT_THAT(e.what(), HasSubstr("came a second time"));
    }
  }
  try {
    order.take(7, -1, "negative", &abandoned);
    ADD_FAILURE() << "a negative micro-batch was taken";
  } catch (const rpc::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("micro-batches count from 0"));
  }
}

}  // namespace
}  // namespace ferry::pipeline
