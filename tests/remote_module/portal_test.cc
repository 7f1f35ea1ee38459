// Routes checked and carried as they are, without processes: where each element of a stage's
// output goes, and what is wrong with routes that cannot be followed.
#include "ferry/remote_module/portal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/rpc/error.h"
#include "tests/support/error_of.h"

namespace ferry::remote_module {
namespace {

using ferry::testing::kind_and_error_of;

using ::testing::HasSubstr;

// Stage 0 sends its activation to stage 1 and a skip straight to stage 2; stage 1 sends its own
// activation to stage 2, which takes (skip, activation).
Routes skip_over_one() { return {{{1, 0}, {2, 0}}, {{2, 1}}, {}}; }

std::string route_error(const Routes& routes, size_t stages) {
  try {
    check_routes(routes, stages);
  } catch (const rpc::Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Portal, RoutesThatFillEveryInputOnceAreAccepted) {
  EXPECT_EQ(route_error(skip_over_one(), 3), "no error");
  EXPECT_EQ(route_error({}, 3), "no error");
  EXPECT_EQ(routed_input_size(skip_over_one(), 0), 0);
  EXPECT_EQ(routed_input_size(skip_over_one(), 1), 1);
  EXPECT_EQ(routed_input_size(skip_over_one(), 2), 2);
}

TEST(Portal, RoutesSurviveTheWire) {
  EXPECT_EQ(routes_from_ivalue(routes_to_ivalue(skip_over_one())), skip_over_one());
}

TEST(Portal, RoutesThatCannotBeFollowedAreNamed) {
  EXPECT_THAT(route_error({{{1, 0}}, {{0, 0}}, {}}, 3),
              HasSubstr("element 0 of stage 1's output is routed to stage 0: it must go to a "
                        "later stage of the 3"));
  EXPECT_THAT(route_error({{{1, 0}, {3, 0}}, {{2, 0}}, {}}, 3),
              HasSubstr("element 1 of stage 0's output is routed to stage 3"));
  EXPECT_THAT(route_error({{{1, 0}, {2, 1}}, {{2, 1}}, {}}, 3),
              HasSubstr("element 0 of stage 1's output is routed to position 1 of stage 2's "
                        "input, which has 2 positions, each filled once"));
  EXPECT_THAT(route_error(skip_over_one(), 4), HasSubstr("routes are given for 3 stages of a "
                                                         "chain of 4"));
  EXPECT_THAT(route_error({{{1, 0}}, {{1, 0}}}, 2),
              HasSubstr("the last stage's output is the chain's"));
  EXPECT_THAT(kind_and_error_of([] { routes_from_ivalue(c10::IValue(int64_t{3})); }),
              HasSubstr("InvalidArgument: routes must be a list of int lists"));
}

}  // namespace
}  // namespace ferry::remote_module
