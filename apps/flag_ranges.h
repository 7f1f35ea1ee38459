// Range checks for the binaries' numeric flags that say in words what was wrong, in one line that
// names the flag: "--accumulate: must be at least 1, not 0". (CLI11's own CLI::Range prints its
// bounds as 17-digit doubles.) Header-only, so that ferry-launch, which links no Ferry library
// but core's base, shares it with the other binaries.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "ferry/core/device_choice.h"
#include "ferry/core/enum_names.h"

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
  const std::string listed = core::listed(allowed);
  return CLI::Validator(
      [allowed, listed](std::string& text) -> std::string {
        for (const std::string& word : allowed) {
          if (text == word) return "";
        }
        return fmt::format("must be {}, not \"{}\"", listed, text);
      },
      "");
}

// A flag of enum type, its words those of `names` (a table of ferry/core/enum_names.h): --help
// lists them as the flag's type, and one_of refuses any other before anything starts. `target`
// is the enum or an optional of it (unset: the flag is not given).
template <typename E, typename Target>
CLI::Option* add_choice(CLI::App* cmd, const std::string& flag, Target& target,
                        const core::EnumNames<E>& names, const std::string& help) {
  const std::vector<std::string> words = core::words_of(names);
  CLI::Option* option = cmd->add_option_function<std::string>(
      flag,
      [&target, &names](const std::string& word) { target = *core::value_named(names, word); },
      help);
  option->check(one_of(words))->type_name(fmt::format("{}", fmt::join(words, "|")));
  if constexpr (std::is_same_v<Target, E>) {
    option->default_str(core::name_of(names, target));
  } else if (target) {
    option->default_str(core::name_of(names, *target));
  }
  return option;
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
