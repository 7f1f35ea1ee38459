// Range checks for the binaries' numeric flags that say in words what was wrong, in one line that
// names the flag: "--accumulate: must be at least 1, not 0". (CLI11's own CLI::Range prints its
// bounds as 17-digit doubles.) Header-only, so that ferry-launch, which links no Ferry library
// but core's base, shares it with the other binaries.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "ferry/core/device_choice.h"

namespace ferry::apps {

// A bound as a user writes it: 1 rather than 1.0, whole numbers in full up to 1e15.
inline std::string bound_text(double bound) {
  if (std::fabs(bound) < 1e15 && bound == std::floor(bound)) {
    return fmt::format("{}", static_cast<long long>(bound));
  }
  return fmt::format("{:g}", bound);
}

// Values from `least` to `most`; with `least_excluded`, above `least` only.
inline CLI::Validator in_range(double least, double most, bool least_excluded = false) {
  const std::string description = fmt::format("{}{} to {}", least_excluded ? "above " : "",
                                              bound_text(least), bound_text(most));
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double value = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || std::isnan(value)) {
          return fmt::format("must be a number, not \"{}\"", text);
        }
        if (least_excluded ? value <= least : value < least) {
          return fmt::format("must be {} {}, not {}", least_excluded ? "above" : "at least",
                             bound_text(least), text);
        }
        if (value > most) return fmt::format("must be at most {}, not {}", bound_text(most), text);
        return "";
      },
      description);
}

// A count of something: 1 or more, at most `most`.
inline CLI::Validator count_up_to(double most) { return in_range(1, most); }

// One of the words `allowed`, refused before anything starts with all of them listed: "--pipeline:
// must be gpipe, 1f1b or zb, not \"foo\"".
inline CLI::Validator one_of(std::vector<std::string> allowed) {
  std::string listed;
  for (std::size_t k = 0; k < allowed.size(); ++k) {
    if (k > 0) listed += k + 1 == allowed.size() ? " or " : ", ";
    listed += allowed[k];
  }
  return CLI::Validator(
      [allowed, listed](std::string& text) -> std::string {
        for (const std::string& word : allowed) {
          if (text == word) return "";
        }
        return fmt::format("must be {}, not \"{}\"", listed, text);
      },
      "");
}

// A device as --device names it; whether this machine has it is checked where the worker starts.
inline CLI::Validator device_name() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          core::choose_device(text, {}, 1 << 20);
          return "";
        } catch (const std::invalid_argument&) {
          return fmt::format("must be auto, cpu, cuda or cuda:N, not \"{}\"", text);
        }
      },
      "auto|cpu|cuda|cuda:N");
}

}  // namespace ferry::apps
