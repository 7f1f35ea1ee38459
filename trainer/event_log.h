// --events: what happened in a run, one JSON object a line, for programs to read (ferry-bench
// chaos) instead of the log's text. Each line has "event", "time" (seconds since the log was
// opened) and "unix_time", then the event's own fields. A run that resumes appends to the file,
// so that it tells the whole story of a job that was restarted.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

// What a job's --events file says of its course so far, for a program that watches the job from
// outside (ferry-bench chaos, an elastic launcher). Value type.
struct JobCourse {
  struct Takeover {
    std::string lost, spare;
  };
  std::int64_t step = 0;        // optimizer steps done, as the last step or resume says
  std::int64_t steps_seen = 0;  // step events, of every run that wrote to the file
  // Each takeover's spares, and the steps it trained again, in the order they happened.
  std::vector<std::vector<Takeover>> takeovers;
  std::vector<std::int64_t> takeover_steps_lost;
  std::vector<std::int64_t> resumed_at;  // the step each --resume went on from
  int ends = 0;                          // runs that ended normally
};

// Reads `path` (nothing yet when it is missing). A last line still being written is left for
// the next read.
JobCourse read_job_course(const std::string& path);

}  // namespace ferry::trainer
