#include "ferry/core/environment.h"

#include <fmt/format.h>
#include <unistd.h>  // environ

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>

#include "ferry/core/log.h"

namespace ferry::core {

std::int64_t parse_whole_number(const std::string& name, const std::string& text, std::int64_t min,
                                const std::string& unit, std::int64_t max) {
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text.c_str(), &end, 10);
  // strtoll would skip leading blanks; a value written with them is a typo worth naming.
  bool whole = !text.empty() && std::isspace(static_cast<unsigned char>(text.front())) == 0 &&
               errno == 0 && *end == '\0';
  if (whole && value >= min && value <= max) return value;
  std::string what = min == 0   ? "a whole, non-negative number"
                     : min == 1 ? "a whole, positive number"
                                : fmt::format("a whole number of at least {}", min);
  if (max != std::numeric_limits<std::int64_t>::max()) what += fmt::format(" up to {}", max);
  if (!unit.empty()) what += " of " + unit;
  throw std::invalid_argument(fmt::format("{}={:?} is not {}", name, text, what));
}

std::optional<std::int64_t> whole_number_from_environment(const std::string& name, std::int64_t min,
                                                          const std::string& unit) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return parse_whole_number(name, value, min, unit);
}

std::map<std::string, std::string> process_environment() {
  std::map<std::string, std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string kv(*entry);
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

void check_log_level_in_environment() {
  const char* value = std::getenv("FERRY_LOG_LEVEL");
  if (value == nullptr || *value == '\0' || log::level_named(value)) return;
  throw std::invalid_argument(
      fmt::format("FERRY_LOG_LEVEL={:?} is not one of trace, debug, info, warn, error, off",
                  std::string(value)));
}

}  // namespace ferry::core
