#include "bench/processes.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>
#include <stdexcept>
#include <thread>

#include "ferry/rpc/rpc.h"

extern char** environ;

namespace ferry::bench {

pid_t spawn_process(const std::string& binary, const std::vector<std::string>& args,
                    const std::map<std::string, std::string>& env, const std::string& output) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    if (!env.count(entry.substr(0, entry.find('=')))) env_strings.push_back(entry);
  }
  for (const auto& [key, value] : env) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings{binary};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!output.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, output.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot start " + binary + ": " + std::strerror(rc));
  return pid;
}

int run_process(const std::string& binary, const std::vector<std::string>& args,
                const std::map<std::string, std::string>& env, const std::string& output) {
  pid_t pid = spawn_process(binary, args, env, output);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void reap_process(pid_t pid, std::chrono::milliseconds grace) {
  int status = 0;
  auto deadline = std::chrono::steady_clock::now() + grace;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::map<std::string, std::string> loopback_world_env(int rank, int world_size, int port) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world_size)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)}};
}

void init_loopback_master(const std::string& name, int world_size, int port) {
  rpc::Options options;
  options.name = name;
  options.rank = 0;
  options.world_size = world_size;
  options.master_addr = "127.0.0.1";
  options.master_port = port;
  rpc::init(options);
}

std::string binary_dir(const std::string& self_path) {
  return self_path.substr(0, self_path.rfind('/'));
}

}  // namespace ferry::bench
