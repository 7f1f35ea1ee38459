// Cutting an ordered list of layers (a model's blocks) into contiguous stages whose largest cost
// is as small as it can be: the partition behind `--stages N --balance ...`. Pure functions on
// cost vectors, so any model whose parts have measured costs can be balanced.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ferry::pipeline {

// Items [begin, end) of the list. Value type.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Range& other) const { return begin == other.begin && end == other.end; }
};

// Splits items 0..n-1 with non-negative `costs` into `stages` contiguous, non-empty ranges whose
// largest sum of costs is the least possible (exact, by dynamic programming over prefix sums:
// O(stages * n^2) time, O(stages * n) memory; n = 70 blocks and 8 stages take microseconds).
// Among the partitions with that least largest cost, it picks one whose largest sum of `tie_costs`
// (same length, if given) is least: balance memory first, then time. Throws
// std::invalid_argument naming the figures when stages < 1, stages > n, the lengths differ or a
// cost is negative.
std::vector<Range> partition_min_max(const std::vector<double>& costs, int64_t stages,
                                     const std::vector<double>& tie_costs = {});

// Whether stage `stage` may hold items [begin, end).
using StageAllowed = std::function<bool(int64_t stage, int64_t begin, int64_t end)>;

// partition_min_max among the cuts whose every stage is allowed (a memory budget, say: what a
// stage holds may depend on its place in a pipeline); empty if no cut is. Throws as
// partition_min_max does.
std::vector<Range> partition_min_max_where(const std::vector<double>& costs, int64_t stages,
                                           const StageAllowed& allowed);

// The sum of `costs` over each range.
std::vector<double> range_costs(const std::vector<double>& costs, const std::vector<Range>& ranges);

// Ranges from the names of the first item of every stage after the first ("layer3.0,decoder.0"
// with three stages), each looked up in `names`. Throws std::invalid_argument naming the item
// that is unknown or out of order.
std::vector<Range> ranges_from_cuts(const std::vector<std::string>& names, const std::string& cuts);

}  // namespace ferry::pipeline
