// Starting other processes and waiting for them, as the launcher, the benchmarks and the tests do.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ferry::core {

// How a child's environment differs from this process's: variables set over it, and variables
// it does not inherit.
struct ChildEnvironment {
  std::map<std::string, std::string> set;
  std::vector<std::string> unset;
};

// Starts `command` (its program, found on PATH when the name has no slash, then its arguments)
// with this process's environment changed by `env`; with `output_fd` >= 0, its stdout goes
// there, and its stderr too unless `stderr_too` is false. Returns its pid. Throws
// std::runtime_error naming the program if it cannot start.
pid_t spawn_process(const std::vector<std::string>& command, const ChildEnvironment& env,
                    int output_fd = -1, bool stderr_too = true);
// The same with variables set only.
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
// `with_stderr` is false (then it goes where this process's does). For tests and tools that
// compose shell lines; a library runs its programs with run_process.
CommandOutput run_command(const std::string& command, bool with_stderr = true);

// Runs `command` (as spawn_process starts it, no shell between) until it exits and keeps what
// it prints, with its stderr unless `with_stderr` is false (then it goes where this process's
// does). A program that cannot start gives status -1 and the reason as its output.
CommandOutput run_process(const std::vector<std::string>& command, const ChildEnvironment& env,
                          bool with_stderr = true);

// This process's executable, as the kernel names it; "" if it cannot say.
std::string executable_path();

// The folder of this process's executable, where Ferry's other binaries are built and installed
// beside it; "" if it cannot say.
std::string executable_dir();

}  // namespace ferry::core
