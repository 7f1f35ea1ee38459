// Starting other processes and waiting for them, as the launcher, the benchmarks and the tests do.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ferry::core {

// Starts `command` (its program, found on PATH when the name has no slash, then its arguments)
// with this process's environment and `env` over it; with `output_fd` >= 0, its stdout and
// stderr go there. Returns its pid. Throws std::runtime_error naming the program if it cannot
// start.
pid_t spawn_process(const std::vector<std::string>& command,
                    const std::map<std::string, std::string>& env, int output_fd = -1);

// The raw wait status of child `pid` once it has exited, or nullopt if it still runs after
// `timeout` (0: just look).
std::optional<int> wait_for_exit(pid_t pid, std::chrono::milliseconds timeout);

struct CommandOutput {
  int status = -1;     // the exit code; -1 if it could not run or a signal ended it
  std::string output;  // what it printed on stdout (and stderr, if asked for)
  // Its last line that is not empty ("" if none): where Ferry's tools print their JSON.
  std::string last_line() const;
};

// Runs `command` through the shell and keeps what it prints, with its stderr unless
// `with_stderr` is false (then it goes where this process's does).
CommandOutput run_command(const std::string& command, bool with_stderr = true);

// This process's executable, as the kernel names it; "" if it cannot say.
std::string executable_path();

// The folder of this process's executable, where Ferry's other binaries are built and installed
// beside it; "" if it cannot say.
std::string executable_dir();

}  // namespace ferry::core
