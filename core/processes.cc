#include "ferry/core/processes.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace ferry::core {

pid_t spawn_process(const std::vector<std::string>& command,
                    const std::map<std::string, std::string>& env, int output_fd) {
  return spawn_process(command, ChildEnvironment{env, {}}, output_fd);
}

pid_t spawn_process(const std::vector<std::string>& command, const ChildEnvironment& env,
                    int output_fd, bool stderr_too) {
  if (command.empty()) throw std::runtime_error("cannot start an empty command");
  // A variable set in `env` replaces this process's own: a second entry would not, since a
  // program's getenv finds the first.
  std::vector<std::string> env_strings;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string kv(*entry);
    const std::string name = kv.substr(0, kv.find('='));
    const bool unset = std::find(env.unset.begin(), env.unset.end(), name) != env.unset.end();
    if (!env.set.count(name) && !unset) env_strings.push_back(std::move(kv));
  }
  for (const auto& [key, value] : env.set) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = command;
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (output_fd >= 0) {
    posix_spawn_file_actions_adddup2(&actions, output_fd, STDOUT_FILENO);
    if (stderr_too) posix_spawn_file_actions_adddup2(&actions, output_fd, STDERR_FILENO);
  }
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot start " + command[0] + ": " + std::strerror(rc));
  return pid;
}

std::optional<int> wait_for_exit(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 || std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string CommandOutput::last_line() const {
  std::string text = output;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.substr(text.rfind('\n') + 1);
}

CommandOutput run_command(const std::string& command, bool with_stderr) {
  CommandOutput result;
  FILE* pipe = popen((with_stderr ? command + " 2>&1" : command).c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), pipe) != nullptr) result.output += buf.data();
  const int status = pclose(pipe);
  result.status = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

CommandOutput run_process(const std::vector<std::string>& command, const ChildEnvironment& env,
                          bool with_stderr) {
  CommandOutput result;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    result.output = std::string("cannot make a pipe: ") + std::strerror(errno);
    return result;
  }
  pid_t pid = -1;
  try {
    pid = spawn_process(command, env, fds[1], with_stderr);
  } catch (const std::exception& e) {
    close(fds[0]);
    close(fds[1]);
    result.output = e.what();
    return result;
  }
  close(fds[1]);
  std::array<char, 4096> buf;
  for (;;) {
    const ssize_t n = read(fds[0], buf.data(), buf.size());
    if (n > 0) {
      result.output.append(buf.data(), static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  pid_t waited = -1;
  do {
    waited = waitpid(pid, &status, 0);
  } while (waited < 0 && errno == EINTR);
  result.status = waited == pid && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string executable_path() {
  std::array<char, 4096> buf;
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string();
}

std::string executable_dir() {
  const std::string self = executable_path();
  const size_t slash = self.rfind('/');
  return slash == std::string::npos ? std::string() : self.substr(0, slash);
}

}  // namespace ferry::core
