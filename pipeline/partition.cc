#include "ferry/pipeline/partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace ferry::pipeline {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The least largest range sum of `costs` over `stages` ranges, where range s is allowed only if
// `allowed(s, begin, end)`; fills `cut[s][i]`: where the last of s + 1 ranges over items [0, i)
// begins.
double solve(const std::vector<double>& prefix, int64_t stages, const StageAllowed& allowed,
             std::vector<std::vector<int64_t>>& cut) {
  const auto n = static_cast<int64_t>(prefix.size()) - 1;
  std::vector<std::vector<double>> best(stages, std::vector<double>(n + 1, kInfinity));
  cut.assign(stages, std::vector<int64_t>(n + 1, -1));
  for (int64_t i = 1; i <= n; ++i) {
    if (allowed(0, 0, i)) {
      best[0][i] = prefix[i];
      cut[0][i] = 0;
    }
  }
  for (int64_t s = 1; s < stages; ++s) {
    for (int64_t i = s + 1; i <= n; ++i) {
      for (int64_t j = s; j < i; ++j) {
        if (best[s - 1][j] == kInfinity || !allowed(s, j, i)) continue;
        double worst = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (worst < best[s][i]) {
          best[s][i] = worst;
          cut[s][i] = j;
        }
      }
    }
  }
  return best[stages - 1][n];
}

std::vector<double> prefix_sums(const std::vector<double>& costs) {
  std::vector<double> prefix(costs.size() + 1, 0.0);
  for (size_t i = 0; i < costs.size(); ++i) prefix[i + 1] = prefix[i] + costs[i];
  return prefix;
}

void check_costs(const std::vector<double>& costs, const char* what) {
  for (size_t i = 0; i < costs.size(); ++i) {
    if (!(costs[i] >= 0)) {
      throw std::invalid_argument(
          fmt::format("{} {} of item {} is not a cost (negative or NaN)", what, costs[i], i));
    }
  }
}

void check_stages(int64_t n, int64_t stages) {
  if (stages < 1 || stages > n) {
    throw std::invalid_argument(
        fmt::format("cannot cut {} items into {} non-empty stages", n, stages));
  }
}

// The ranges `cut` (as solve fills it) gives over n items.
std::vector<Range> ranges_of(const std::vector<std::vector<int64_t>>& cut, int64_t n,
                             int64_t stages) {
  std::vector<Range> ranges(stages);
  int64_t end = n;
  for (int64_t s = stages - 1; s >= 0; --s) {
    int64_t begin = cut[s][end];
    ranges[s] = {begin, end};
    end = begin;
  }
  return ranges;
}

}  // namespace

std::vector<Range> partition_min_max(const std::vector<double>& costs, int64_t stages,
                                     const std::vector<double>& tie_costs) {
  const auto n = static_cast<int64_t>(costs.size());
  check_stages(n, stages);
  if (!tie_costs.empty() && tie_costs.size() != costs.size()) {
    throw std::invalid_argument(
        fmt::format("{} costs but {} tie-break costs", costs.size(), tie_costs.size()));
  }
  check_costs(costs, "cost");
  check_costs(tie_costs, "tie-break cost");
  const std::vector<double> prefix = prefix_sums(costs);
  std::vector<std::vector<int64_t>> cut;
  const double least = solve(
      prefix, stages, [](int64_t, int64_t, int64_t) { return true; }, cut);
  if (!tie_costs.empty()) {
    // Only ranges no costlier than the optimum; a relative slack absorbs rounding of the sums.
    const double bound = least * (1 + 1e-12) + 1e-300;
    solve(
        prefix_sums(tie_costs), stages,
        [&](int64_t, int64_t b, int64_t e) { return prefix[e] - prefix[b] <= bound; }, cut);
  }
  return ranges_of(cut, n, stages);
}

std::vector<Range> partition_min_max_where(const std::vector<double>& costs, int64_t stages,
                                           const StageAllowed& allowed) {
  const auto n = static_cast<int64_t>(costs.size());
  check_stages(n, stages);
  check_costs(costs, "cost");
  std::vector<std::vector<int64_t>> cut;
  if (solve(prefix_sums(costs), stages, allowed, cut) == kInfinity) return {};
  return ranges_of(cut, n, stages);
}

std::vector<double> range_costs(const std::vector<double>& costs,
                                const std::vector<Range>& ranges) {
  std::vector<double> out;
  for (const Range& r : ranges) {
    double sum = 0;
    for (int64_t i = r.begin; i < r.end; ++i) sum += costs.at(i);
    out.push_back(sum);
  }
  return out;
}

std::vector<Range> ranges_from_cuts(const std::vector<std::string>& names,
                                    const std::string& cuts) {
  std::vector<int64_t> starts{0};
  std::stringstream items(cuts);
  std::string item;
  while (std::getline(items, item, ',')) {
    auto it = std::find(names.begin(), names.end(), item);
    if (it == names.end()) {
      throw std::invalid_argument(fmt::format("\"{}\" is not the name of a block", item));
    }
    auto start = static_cast<int64_t>(it - names.begin());
    if (start <= starts.back()) {
      throw std::invalid_argument(fmt::format(
          "\"{}\" does not come after the start of the stage before it (\"{}\"): name the "
          "first block of each stage after the first, in order",
          item, names[starts.back()]));
    }
    starts.push_back(start);
  }
  std::vector<Range> ranges;
  for (size_t s = 0; s < starts.size(); ++s) {
    ranges.push_back(
        {starts[s], s + 1 < starts.size() ? starts[s + 1] : static_cast<int64_t>(names.size())});
  }
  return ranges;
}

}  // namespace ferry::pipeline
