#include "trainer/event_log.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "ferry/rpc/error.h"

namespace ferry::trainer {

EventLog::EventLog(const std::string& path) : path_(path) {
  if (path.empty()) return;
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) {
    rpc::refuse(fmt::format("--events: cannot open \"{}\": {}", path, std::strerror(errno)));
  }
}

EventLog::~EventLog() {
  if (file_) std::fclose(file_);
}

void EventLog::add(const std::string& event, const nlohmann::ordered_json& fields) {
  if (!file_) return;
  nlohmann::ordered_json line = {
      {"event", event},
      {"time", std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count()},
      {"unix_time",
       std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()}};
  for (const auto& [key, value] : fields.items()) line[key] = value;
  const std::string text = line.dump() + "\n";
  std::lock_guard<std::mutex> lock(mutex_);
  // A full disk loses the events, not the run.
  std::fwrite(text.data(), 1, text.size(), file_);
  std::fflush(file_);
}

}  // namespace ferry::trainer
