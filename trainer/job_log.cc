#include "trainer/job_log.h"

#include <regex>
#include <sstream>

namespace ferry::trainer {

JobCourse read_job_course(const std::string& output) {
  static const std::regex progress(R"(epoch (\d+)/\d+ \[[#.]*\] (\d+)/(\d+))");
  static const std::regex takeover(R"re(worker "([^"]+)" was lost; spare "([^"]+)" takes over)re");
  JobCourse course;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    // A terminal's progress bar rewrites one line with carriage returns: the last one counts.
    const std::string last =
        line.substr(line.rfind('\r') == std::string::npos ? 0 : line.rfind('\r') + 1);
    std::smatch m;
    if (std::regex_search(last, m, progress)) {
      course.epoch = std::stoi(m[1]);
      course.step = std::stoi(m[2]);
      course.steps_per_epoch = std::stoi(m[3]);
      course.global_step =
          static_cast<long>(course.epoch - 1) * course.steps_per_epoch + course.step;
      ++course.progress_lines;
    }
    for (auto it = std::sregex_iterator(line.begin(), line.end(), takeover);
         it != std::sregex_iterator(); ++it) {
      course.takeovers.push_back({(*it)[1], (*it)[2]});
    }
    if (line.find("training goes on from epoch") != std::string::npos) ++course.went_back;
  }
  return course;
}

}  // namespace ferry::trainer
