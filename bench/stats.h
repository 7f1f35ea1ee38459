// What every benchmark reports: medians of repeated timings (this machine is shared and noisy).
#pragma once

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

namespace ferry::bench {

using Clock = std::chrono::steady_clock;

inline double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

inline double median(std::vector<double> v) { return percentile(std::move(v), 0.5); }

template <typename F>
double seconds_of(F&& f) {
  auto start = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace ferry::bench
