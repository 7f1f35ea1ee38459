// Ferry's settings from environment variables, read one way: unset or empty means "not set";
// anything else must parse, or the error names the variable and the value it holds.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>

namespace ferry::core {

// `text`, the value of `name`, as a whole number from `min` to `max` (of what `unit` names: "MiB",
// "seconds"). Throws std::invalid_argument naming the variable and its value otherwise; the
// rpc layer reports it as Error(Init).
std::int64_t parse_whole_number(const std::string& name, const std::string& text, std::int64_t min,
                                const std::string& unit = "",
                                std::int64_t max = std::numeric_limits<std::int64_t>::max());

// This process's variable `name`, parsed as parse_whole_number does; nullopt when unset or empty.
std::optional<std::int64_t> whole_number_from_environment(const std::string& name, std::int64_t min,
                                                          const std::string& unit = "");

// This process's environment variables by name.
std::map<std::string, std::string> process_environment();

// Throws std::invalid_argument if FERRY_LOG_LEVEL is set to something that is not a level. The
// logger itself never throws: it falls back to info, and the agent checks this when it starts.
void check_log_level_in_environment();

}  // namespace ferry::core
