#include "apps/local_launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <stdexcept>
#include <thread>

#include "ferry/core/local_world.h"
#include "ferry/core/processes.h"

namespace ferry::apps {
namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t pending_signal = 0;
void remember_signal(int sig) { pending_signal = sig; }

struct Child {
  int rank;
  pid_t pid = -1;
  int output = -1;  // read end of its stdout and stderr
  std::string partial;
  bool running = true;
  bool output_open = true;  // until its pipe reports end of file
};

// Passes on complete lines (ended by \n, or by \r for progress bars) with the rank in front.
void relay(Child& child, bool flush_all) {
  char buf[65536];
  while (child.output_open) {
    ssize_t n = read(child.output, buf, sizeof buf);
    if (n > 0) {
      child.partial.append(buf, n);
      continue;
    }
    if (n == 0) {
      // Closed pipes would make poll() return at once forever: stop watching this one.
      close(child.output);
      child.output_open = false;
    }
    break;
  }
  std::size_t start = 0;
  for (std::size_t i = 0; i < child.partial.size(); ++i) {
    char c = child.partial[i];
    if (c != '\n' && c != '\r') continue;
    std::string line = child.partial.substr(start, i - start);
    std::fprintf(stdout, "[rank %d] %s%c", child.rank, line.c_str(), c);
    start = i + 1;
  }
  child.partial.erase(0, start);
  if (flush_all && !child.partial.empty()) {
    std::fprintf(stdout, "[rank %d] %s\n", child.rank, child.partial.c_str());
    child.partial.clear();
  }
  std::fflush(stdout);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "stopped";
}

// Starts every rank with its output on a pipe of its own. False, with what was started stopped,
// if one cannot be.
bool start_children(const LaunchSettings& s, const std::string& port_file, bool set_spin,
                    std::vector<Child>& children) {
  for (int rank = 0; rank < s.nproc; ++rank) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      std::perror("ferry-launch: pipe");
      return false;
    }
    std::map<std::string, std::string> env =
        core::loopback_world_env(rank, s.nproc, s.port, port_file);
    env["LOCAL_RANK"] = std::to_string(rank);
    if (set_spin) env["GOMP_SPINCOUNT"] = core::kSharedMachineSpinCount;
    children[rank].rank = rank;
    try {
      children[rank].pid = core::spawn_process(s.command, env, fds[1]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ferry-launch: %s\n", e.what());
    }
    close(fds[1]);
    children[rank].output = fds[0];
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    if (children[rank].pid < 0) {
      children[rank].running = false;
      for (auto& c : children) {
        if (c.pid > 0) kill(c.pid, SIGTERM);
      }
      return false;
    }
  }
  return true;
}

// Watches the running ranks until every one has ended, relaying their output, and decides when
// the others are stopped. Resource type, of the launcher's thread.
class Supervisor {
 public:
  Supervisor(const LaunchSettings& s, std::vector<Child>& children)
      : s_(s), children_(children), running_(s.nproc) {}

  int run() {
    while (running_ > 0) {
      wait_for_output();
      if (pending_signal && !stopping_) pass_on_signal();
      int status = 0;
      pid_t pid;
      while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (auto& c : children_) {
          if (c.pid != pid || !c.running) continue;
          c.running = false;
          --running_;
          relay(c, true);
          on_exit(c, status);
        }
      }
      check_deadlines();
    }
    for (auto& c : children_) relay(c, true);
    return exit_code_;
  }

 private:
  void wait_for_output() {
    std::vector<pollfd> fds;
    for (auto& c : children_) {
      if (c.output_open) fds.push_back({c.output, POLLIN, 0});
    }
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } else {
      poll(fds.data(), fds.size(), 100);
    }
    for (auto& c : children_) relay(c, false);
  }

  void pass_on_signal() {
    std::fprintf(stderr, "ferry-launch: passing signal %d on to every rank\n",
                 static_cast<int>(pending_signal));
    for (auto& c : children_) {
      if (c.running) kill(c.pid, pending_signal);
    }
    stopping_ = true;
    exit_code_ = 128 + pending_signal;
    stop_deadline_ = Clock::now() + std::chrono::seconds(10);
  }

  void stop_all() {
    for (auto& other : children_) {
      if (other.running) kill(other.pid, SIGTERM);
    }
    stopping_ = true;
    exit_code_ = 1;
    stop_deadline_ = Clock::now() + std::chrono::seconds(10);
  }

  void on_exit(const Child& c, int status) {
    const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (failed && !stopping_ && s_.tolerate_lost_workers && c.rank != 0) {
      std::fprintf(stderr, "ferry-launch: rank %d (pid %d) %s; the others go on\n", c.rank,
                   static_cast<int>(c.pid), describe_status(status).c_str());
      return;
    }
    if (failed && !stopping_ && !waiting_for_master_ && c.rank != 0 && children_[0].running &&
        s_.grace_s > 0) {
      std::fprintf(stderr,
                   "ferry-launch: rank %d (pid %d) %s; rank 0 has %g s to end by itself before "
                   "the others are stopped\n",
                   c.rank, static_cast<int>(c.pid), describe_status(status).c_str(), s_.grace_s);
      waiting_for_master_ = true;
      exit_code_ = 1;
      grace_deadline_ =
          Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(s_.grace_s * 1000));
      return;
    }
    if (waiting_for_master_ && !stopping_ && c.rank != 0) {
      // Most likely a consequence of the first loss; rank 0 is still the one to hear.
      if (failed) {
        std::fprintf(stderr, "ferry-launch: rank %d (pid %d) %s too\n", c.rank,
                     static_cast<int>(c.pid), describe_status(status).c_str());
      }
      return;
    }
    if ((failed || waiting_for_master_) && !stopping_) {
      std::fprintf(stderr, "ferry-launch: rank %d (pid %d) %s; stopping the others\n", c.rank,
                   static_cast<int>(c.pid), describe_status(status).c_str());
      stop_all();
      // Rank 0's own code says why the job failed (out of memory, bad settings).
      if (c.rank == 0 && WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        exit_code_ = WEXITSTATUS(status);
      }
    }
  }

  void check_deadlines() {
    if (waiting_for_master_ && !stopping_ && Clock::now() > grace_deadline_) {
      std::fprintf(stderr, "ferry-launch: rank 0 did not end within %g s; stopping the others\n",
                   s_.grace_s);
      stop_all();
    }
    if (stopping_ && Clock::now() > stop_deadline_) {
      for (auto& c : children_) {
        if (c.running) kill(c.pid, SIGKILL);
      }
    }
  }

  const LaunchSettings& s_;
  std::vector<Child>& children_;
  int running_;
  int exit_code_ = 0;
  bool stopping_ = false;
  Clock::time_point stop_deadline_ = Clock::time_point::max();
  // A rank other than 0 died: rank 0 may still explain before the world is stopped.
  bool waiting_for_master_ = false;
  Clock::time_point grace_deadline_ = Clock::time_point::max();
};

}  // namespace

int launch_local_world(LaunchSettings s) {
  // Without --master-port, rank 0's store binds a port of the system's choosing and writes it
  // to a file the other ranks read.
  std::optional<core::PortFile> port_file;
  if (s.port == 0) {
    try {
      port_file.emplace();
    } catch (const std::runtime_error& e) {
      std::fprintf(stderr, "ferry-launch: %s\n", e.what());
      return 2;
    }
  }
  const bool set_spin = s.nproc > 1 && std::getenv("GOMP_SPINCOUNT") == nullptr;
  if (set_spin) {
    std::fprintf(stderr,
                 "ferry-launch: GOMP_SPINCOUNT=%s for every rank, since they share this "
                 "machine's cores (set it yourself to choose another)\n",
                 core::kSharedMachineSpinCount);
  }
  signal(SIGINT, remember_signal);
  signal(SIGTERM, remember_signal);
  std::vector<Child> children(s.nproc);
  if (!start_children(s, port_file ? port_file->path() : "", set_spin, children)) return 1;
  return Supervisor(s, children).run();
}

}  // namespace ferry::apps
