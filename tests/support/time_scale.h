// One scale for every time bound of the tests. A bound says that progress happens, not how fast:
// it is generous at scale 1, and FERRY_TEST_TIME_SCALE (a number, at least 1) raises every bound
// at once on a machine slower or busier than any the suite was written on. A sanitizer build
// multiplies it by its own slowdown.
#pragma once

#include <chrono>
#include <cstdlib>
#include <string>

#include "tests/support/sanitizer_allowance.h"

namespace ferry::testing {

inline double time_scale() {
  static const double scale = [] {
    const char* text = std::getenv("FERRY_TEST_TIME_SCALE");
    double value = text ? std::atof(text) : 1.0;
    return (value < 1.0 ? 1.0 : value) * kSanitizerSlowdown;
  }();
  return scale;
}

// `bound` times the scale.
template <typename Rep, typename Period>
std::chrono::milliseconds scaled(std::chrono::duration<Rep, Period> bound) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(
      std::chrono::duration<double, std::milli>(bound).count() * time_scale()));
}

}  // namespace ferry::testing
