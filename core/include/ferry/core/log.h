// A small leveled logger. Every line carries the process's worker name; FERRY_LOG_LEVEL
// (trace, debug, info, warn, error, off) sets the level. Safe to call from any thread.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>

namespace ferry::log {

enum class Level { Trace = 0, Debug, Info, Warn, Error, Off };

Level level();
// The level called `name` (any case), or nullopt.
std::optional<Level> level_named(const std::string& name);
void set_level(Level level);
// The name shown in every line, e.g. "worker1"; set once the agent knows it.
void set_worker_name(const std::string& name);
void write(Level level, const std::string& message);

template <typename... Args>
void emit(Level lvl, fmt::format_string<Args...> format, Args&&... args) {
  if (lvl < level()) return;
  write(lvl, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... a) {
  emit(Level::Debug, f, std::forward<Args>(a)...);
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... a) {
  emit(Level::Info, f, std::forward<Args>(a)...);
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... a) {
  emit(Level::Warn, f, std::forward<Args>(a)...);
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... a) {
  emit(Level::Error, f, std::forward<Args>(a)...);
}

}  // namespace ferry::log
