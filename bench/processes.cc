#include "bench/processes.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "ferry/core/processes.h"
#include "ferry/rpc/rpc.h"

namespace ferry::bench {

pid_t spawn_process(const std::string& binary, const std::vector<std::string>& args,
                    const std::map<std::string, std::string>& env, const std::string& output) {
  std::vector<std::string> command = {binary};
  command.insert(command.end(), args.begin(), args.end());
  int fd = -1;
  if (!output.empty()) {
    fd = ::open(output.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("cannot open " + output + ": " + std::strerror(errno));
  }
  try {
    pid_t pid = core::spawn_process(command, env, fd);
    if (fd >= 0) ::close(fd);
    return pid;
  } catch (...) {
    if (fd >= 0) ::close(fd);
    throw;
  }
}

int run_process(const std::string& binary, const std::vector<std::string>& args,
                const std::map<std::string, std::string>& env, const std::string& output) {
  pid_t pid = spawn_process(binary, args, env, output);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void reap_process(pid_t pid, std::chrono::milliseconds grace) {
  if (core::wait_for_exit(pid, grace)) return;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

void init_loopback_master(const std::string& name, int world_size, const std::string& port_file) {
  rpc::Options options = rpc::loopback_options(name, 0, world_size, 0);
  options.master_port_file = port_file;
  rpc::init(options);
}

}  // namespace ferry::bench
