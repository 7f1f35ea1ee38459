// How much memory a process on this machine has used at its peak: what every end-of-run table
// and benchmark of Ferry reports per worker.
#pragma once

#include <sys/types.h>

#include <fstream>
#include <string>

namespace ferry::rpc {

// The peak resident memory (VmHWM) of `pid` (0: this process), MiB; -1 if unknown.
inline double peak_rss_mib(pid_t pid = 0) {
  std::ifstream status(pid == 0 ? std::string("/proc/self/status")
                                : "/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

}  // namespace ferry::rpc
