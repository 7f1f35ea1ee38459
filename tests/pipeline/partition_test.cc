// The min-max partition behind --stages N --balance: optimal against brute force on random cost
// vectors, on splits whose best is known, with its tie-break and its errors; and manual cuts.
#include "ferry/pipeline/partition.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <stdexcept>

namespace ferry::pipeline {
namespace {

using ::testing::HasSubstr;

double largest(const std::vector<double>& costs, const std::vector<Range>& ranges) {
  std::vector<double> sums = range_costs(costs, ranges);
  return *std::max_element(sums.begin(), sums.end());
}

// The least largest range sum over every way to cut `costs` into `stages` ranges.
double brute_force(const std::vector<double>& costs, int64_t stages) {
  const auto n = static_cast<int64_t>(costs.size());
  double best = 1e300;
  std::vector<int64_t> starts{0};
  std::function<void(int64_t)> cut = [&](int64_t from) {
    if (static_cast<int64_t>(starts.size()) == stages) {
      std::vector<Range> ranges;
      for (size_t s = 0; s < starts.size(); ++s) {
        ranges.push_back({starts[s], s + 1 < starts.size() ? starts[s + 1] : n});
      }
      best = std::min(best, largest(costs, ranges));
      return;
    }
    for (int64_t next = from + 1; next < n; ++next) {
      starts.push_back(next);
      cut(next);
      starts.pop_back();
    }
  };
  cut(0);
  return best;
}

void expect_contiguous_cover(const std::vector<Range>& ranges, int64_t n, int64_t stages) {
  ASSERT_EQ(static_cast<int64_t>(ranges.size()), stages);
  int64_t next = 0;
  for (const Range& r : ranges) {
    EXPECT_EQ(r.begin, next);
    EXPECT_GT(r.size(), 0);
    next = r.end;
  }
  EXPECT_EQ(next, n);
}

TEST(Partition, MatchesBruteForceOnRandomCostVectors) {
  std::mt19937 rng(12345);
  std::uniform_real_distribution<double> cost(0.0, 10.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = 1 + trial % 11;
    std::vector<double> costs(n);
    for (double& c : costs) c = trial % 3 == 0 ? std::floor(cost(rng)) : cost(rng);
    for (int64_t stages = 1; stages <= std::min<int64_t>(n, 5); ++stages) {
      std::vector<Range> ranges = partition_min_max(costs, stages);
      expect_contiguous_cover(ranges, n, stages);
      EXPECT_DOUBLE_EQ(largest(costs, ranges), brute_force(costs, stages))
          << "trial " << trial << ", " << stages << " stages";
    }
  }
}

TEST(Partition, FindsSplitsWhoseBestIsKnown) {
  EXPECT_EQ(partition_min_max({10, 1, 1, 1, 10}, 3), (std::vector<Range>{{0, 1}, {1, 4}, {4, 5}}));
  EXPECT_EQ(partition_min_max({5, 5, 5, 5}, 2), (std::vector<Range>{{0, 2}, {2, 4}}));
  // One item heavier than all the others together gets a stage of its own.
  std::vector<double> heavy{1, 1, 100, 1, 1};
  EXPECT_DOUBLE_EQ(largest(heavy, partition_min_max(heavy, 3)), 100);
  // One item per stage.
  EXPECT_EQ(partition_min_max({3, 1, 2}, 3), (std::vector<Range>{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(partition_min_max({3, 1, 2}, 1), (std::vector<Range>{{0, 3}}));
}

TEST(Partition, OnlyCutsWhoseEveryStageIsAllowedCount) {
  // The best cut of four equal items in two is 2 and 2; with stage 0 allowed one item at most,
  // it is 1 and 3. A condition that depends on the stage sees each stage's own index.
  const std::vector<double> costs{1, 1, 1, 1};
  auto first_holds_one = [](int64_t stage, int64_t begin, int64_t end) {
    return stage != 0 || end - begin <= 1;
  };
  EXPECT_EQ(partition_min_max_where(costs, 2, first_holds_one),
            (std::vector<Range>{{0, 1}, {1, 4}}));
  EXPECT_EQ(partition_min_max_where(costs, 2, [](int64_t, int64_t, int64_t) { return true; }),
            partition_min_max(costs, 2));
  // No cut has every stage allowed: none.
  EXPECT_TRUE(partition_min_max_where(costs, 2, [](int64_t, int64_t b, int64_t e) {
                return e - b == 1;
              }).empty());
}

TEST(Partition, AmongEquallyGoodSplitsTheTieCostsDecide) {
  // Every cut of the first costs leaves a largest stage of 2; the second costs are 10, 5 and 10
  // for cuts after items 0, 1 and 2.
  std::vector<Range> ranges = partition_min_max({2, 0, 0, 2}, 2, {0, 5, 5, 0});
  EXPECT_EQ(ranges, (std::vector<Range>{{0, 2}, {2, 4}}));
  // The tie-break never costs the first objective.
  std::vector<double> first{4, 1, 1, 1, 1, 4}, second{0, 9, 0, 0, 9, 0};
  std::vector<Range> balanced = partition_min_max(first, 3, second);
  EXPECT_DOUBLE_EQ(largest(first, balanced), largest(first, partition_min_max(first, 3)));
}

TEST(Partition, BadRequestsNameTheFigures) {
  try {
    partition_min_max({1, 2}, 3);
    FAIL() << "3 stages of 2 items";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot cut 2 items into 3 non-empty stages"));
  }
  try {
    partition_min_max({1, 2}, 0);
    FAIL() << "0 stages";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("into 0 non-empty stages"));
  }
  try {
    partition_min_max({1, -2}, 1);
    FAIL() << "a negative cost";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("cost -2 of item 1"));
  }
  try {
    partition_min_max({1, 2}, 1, {1});
    FAIL() << "tie costs of another length";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("2 costs but 1 tie-break costs"));
  }
}

TEST(Partition, ManualCutsNameTheFirstItemOfEachStageAfterTheFirst) {
  const std::vector<std::string> names{"stem", "layer1.0", "decoder.0", "head"};
  EXPECT_EQ(ranges_from_cuts(names, "layer1.0,head"), (std::vector<Range>{{0, 1}, {1, 3}, {3, 4}}));
  EXPECT_EQ(ranges_from_cuts(names, ""), (std::vector<Range>{{0, 4}}));
  try {
    ranges_from_cuts(names, "layer9.9");
    FAIL() << "an unknown block";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("\"layer9.9\" is not the name of a block"));
  }
  try {
    ranges_from_cuts(names, "decoder.0,layer1.0");
    FAIL() << "cuts out of order";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("\"layer1.0\" does not come after the start of the stage "
                                    "before it (\"decoder.0\")"));
  }
  try {
    ranges_from_cuts(names, "stem");
    FAIL() << "a cut at the first block";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("\"stem\" does not come after"));
  }
}

}  // namespace
}  // namespace ferry::pipeline
