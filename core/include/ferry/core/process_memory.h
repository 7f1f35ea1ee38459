// How much memory a process on this machine has used at its peak: what every end-of-run table
// and benchmark of Ferry reports per worker.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace ferry::core {

// A "Vm...:" line of /proc/<pid>/status (0: this process), MiB; -1 if unknown.
inline double status_mib(pid_t pid, const std::string& field) {
  std::ifstream status(pid == 0 ? std::string("/proc/self/status")
                                : "/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  }
  return -1;
}

// The peak resident memory (VmHWM) of `pid` (0: this process), MiB; -1 if unknown.
inline double peak_rss_mib(pid_t pid = 0) { return status_mib(pid, "VmHWM"); }
// The resident memory now (VmRSS), MiB; -1 if unknown.
inline double rss_mib(pid_t pid = 0) { return status_mib(pid, "VmRSS"); }

// Tensor memory of this process, counted at the CPU allocator rpc::init() installs (see
// ferry/core/tensor_cache.h; nothing is counted with FERRY_TENSOR_CACHE_MIB=0): what is live now
// and the most that was live since the last reset. Resident set size cannot show what a step kept:
// the C heap and the cache keep freed pages, so RSS only grows. Safe from any thread.
struct TensorMemory {
  std::int64_t live_bytes = 0;
  std::int64_t peak_bytes = 0;
};
TensorMemory tensor_memory();
// Starts a new peak from what is live now.
void reset_tensor_memory_peak();
// Counts tensor memory in a process that starts no agent (rpc::init() does this itself): installs
// the allocator of ferry/core/tensor_cache.h. Idempotent.
void count_tensor_memory();

// A bound on this process's tensor memory, the CPU stand-in for a device's memory: past it,
// allocating a tensor throws c10::OutOfMemoryError saying how much was asked for, how much is held
// and the budget. 0 (the default) is no bound. FERRY_MEMORY_BUDGET_MIB sets it (in MiB) when the
// allocator is installed; a value that is not a whole number of MiB is an error naming it. Counted
// only where the allocator is installed. Tensors received from the wire count towards what is held
// but never fail: the computation that allocates next does. Safe from any thread.
void set_tensor_memory_budget(std::int64_t bytes);
std::int64_t tensor_memory_budget();
// The words every over-budget message contains, for the people who read it: code tells the error
// by its type (c10::OutOfMemoryError; rpc::ErrorKind::OutOfMemory once it crossed a call).
inline constexpr const char* kOverBudget = "over this process's tensor memory budget";

}  // namespace ferry::core
