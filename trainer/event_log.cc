#include "trainer/event_log.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>

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

JobCourse read_job_course(const std::string& path) {
  JobCourse course;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json event = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!event.is_object()) continue;  // the last line, half written
    const std::string kind = event.value("event", "");
    if (kind == "step") {
      course.step = event.at("step").get<std::int64_t>();
      ++course.steps_seen;
    } else if (kind == "takeover") {
      std::vector<JobCourse::Takeover> spares;
      for (const auto& t : event.at("taken")) {
        spares.push_back({t.at("lost").get<std::string>(), t.at("spare").get<std::string>()});
      }
      course.takeovers.push_back(std::move(spares));
      course.takeover_steps_lost.push_back(event.at("steps_lost").get<std::int64_t>());
      course.step = event.at("step").get<std::int64_t>();
    } else if (kind == "resume") {
      course.resumed_at.push_back(event.at("step").get<std::int64_t>());
      course.step = event.at("step").get<std::int64_t>();
    } else if (kind == "end") {
      ++course.ends;
    }
  }
  return course;
}

}  // namespace ferry::trainer
