// --events: what happened in a run, one JSON object a line, for programs to read (ferry-bench
// chaos) instead of the log's text. Each line has "event", "time" (seconds since the log was
// opened) and "unix_time", then the event's own fields. A run that resumes appends to the file,
// so that it tells the whole story of a job that was restarted.
#pragma once

#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

namespace ferry::trainer {

// Resource type. add() may be called from any thread (the checkpoint writer's says when a
// checkpoint is on disk).
class EventLog {
 public:
  // An empty `path` writes nothing. Throws rpc::Error(InvalidArgument) naming the file when it
  // cannot be opened.
  explicit EventLog(const std::string& path);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // One line, on disk before add() returns: a run killed after it leaves it whole.
  void add(const std::string& event, const nlohmann::ordered_json& fields = {});

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mutex_;
};

}  // namespace ferry::trainer
