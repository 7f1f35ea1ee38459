#include "ferry/core/log.h"

#include <strings.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace ferry::log {
namespace {

// A bad value is reported by the agent when it starts (ferry/core/environment.h); logging goes on
// at info meanwhile, since a log call must never throw.
Level level_from_env() {
  const char* env = std::getenv("FERRY_LOG_LEVEL");
  if (env == nullptr) return Level::Info;
  return level_named(env).value_or(Level::Info);
}

std::atomic<int>& current_level() {
  static std::atomic<int> value{static_cast<int>(level_from_env())};
  return value;
}

std::mutex& name_mutex() {
  static std::mutex m;
  return m;
}

std::string& worker_name() {
  static std::string name = fmt::format("pid{}", ::getpid());
  return name;
}

}  // namespace

std::optional<Level> level_named(const std::string& name) {
  static const char* kNames[] = {"trace", "debug", "info", "warn", "error", "off"};
  for (int i = 0; i <= static_cast<int>(Level::Off); ++i) {
    if (strcasecmp(name.c_str(), kNames[i]) == 0) return static_cast<Level>(i);
  }
  return std::nullopt;
}

Level level() { return static_cast<Level>(current_level().load(std::memory_order_relaxed)); }

void set_level(Level lvl) { current_level().store(static_cast<int>(lvl)); }

void set_worker_name(const std::string& name) {
  std::lock_guard<std::mutex> lock(name_mutex());
  worker_name() = name;
}

void write(Level lvl, const std::string& message) {
  static const char* kTags[] = {"T", "D", "I", "W", "E", "-"};
  auto now = std::chrono::system_clock::now().time_since_epoch();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now).count();
  std::string line;
  {
    std::lock_guard<std::mutex> lock(name_mutex());
    line = fmt::format("[{}.{:03d} {} {}] {}\n", (ms / 1000) % 100000, static_cast<int>(ms % 1000),
                       kTags[static_cast<int>(lvl)], worker_name(), message);
  }
  // One fwrite per line keeps lines from different threads whole.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace ferry::log
