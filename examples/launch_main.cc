// ferry-launch: runs N copies of a command on this machine as one world, in the manner of
// torchrun: each gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and a free MASTER_PORT; every
// line it prints comes out prefixed with its rank; SIGINT and SIGTERM are passed on; and if one
// copy dies the others are stopped and the launcher exits non-zero, saying which one and how
// (with --tolerate-lost-workers, only if it is rank 0: a master with spares carries on). When a
// rank other than 0 dies, rank 0 first gets --grace-s seconds to end by itself: it is the one that
// can say what the loss means (which stages were lost, which checkpoint is intact).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "ferry/core/local_world.h"
#include "ferry/core/processes.h"


namespace {

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Ferry launcher: runs N copies of a command as one world on this machine");
  int nproc = 1;
  int port = 0;
  std::vector<std::string> command;
  app.add_option("--nproc", nproc, "processes to start")->check(CLI::Range(1, 4096));
  app.add_option("--master-port", port, "rendezvous port (default: a free one)");
  bool tolerate_lost_workers = false;
  app.add_flag("--tolerate-lost-workers", tolerate_lost_workers,
               "a rank other than 0 that dies does not stop the others (ferry-master train "
               "--spares rebuilds its stages)");
  double grace_s = 30;
  app.add_option("--grace-s", grace_s,
                 "when a rank other than 0 dies, how long rank 0 may take to end by itself (and "
                 "explain) before the others are stopped")
      ->check(CLI::NonNegativeNumber);
  app.add_option("command", command, "the command, after --")->required();
  CLI11_PARSE(app, argc, argv);
  if (port == 0) {
    try {
      port = ferry::core::pick_free_port();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ferry-launch: %s\n", e.what());
      return 2;
    }
  }

  bool set_spin = nproc > 1 && std::getenv("GOMP_SPINCOUNT") == nullptr;
  if (set_spin) {
    std::fprintf(stderr,
                 "ferry-launch: GOMP_SPINCOUNT=%s for every rank, since they share this "
                 "machine's cores (set it yourself to choose another)\n",
                 ferry::core::kSharedMachineSpinCount);
  }
  signal(SIGINT, remember_signal);
  signal(SIGTERM, remember_signal);
  std::vector<Child> children(nproc);
  for (int rank = 0; rank < nproc; ++rank) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      std::perror("ferry-launch: pipe");
      return 1;
    }
    std::map<std::string, std::string> env = ferry::core::loopback_world_env(rank, nproc, port);
    env["LOCAL_RANK"] = std::to_string(rank);
    if (set_spin) env["GOMP_SPINCOUNT"] = ferry::core::kSharedMachineSpinCount;
    children[rank].rank = rank;
    try {
      children[rank].pid = ferry::core::spawn_process(command, env, fds[1]);
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
      return 1;
    }
  }

  int exit_code = 0;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  // A rank other than 0 died: rank 0 may still explain before the world is stopped.
  bool waiting_for_master = false;
  auto grace_deadline = std::chrono::steady_clock::time_point::max();
  auto stop_all = [&] {
    for (auto& other : children) {
      if (other.running) kill(other.pid, SIGTERM);
    }
    stopping = true;
    exit_code = 1;
    stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  };
  int running = nproc;
  while (running > 0) {
    std::vector<pollfd> fds;
    for (auto& c : children) {
      if (c.output_open) fds.push_back({c.output, POLLIN, 0});
    }
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } else {
      poll(fds.data(), fds.size(), 100);
    }
    for (auto& c : children) relay(c, false);
    if (pending_signal && !stopping) {
      std::fprintf(stderr, "ferry-launch: passing signal %d on to every rank\n",
                   static_cast<int>(pending_signal));
      for (auto& c : children) {
        if (c.running) kill(c.pid, pending_signal);
      }
      stopping = true;
      exit_code = 128 + pending_signal;
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    }
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& c : children) {
        if (c.pid != pid || !c.running) continue;
        c.running = false;
        --running;
        relay(c, true);
        bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed && !stopping && tolerate_lost_workers && c.rank != 0) {
          std::fprintf(stderr, "ferry-launch: rank %d (pid %d) %s; the others go on\n", c.rank,
                       static_cast<int>(pid), describe_status(status).c_str());
          continue;
        }
        if (failed && !stopping && !waiting_for_master && c.rank != 0 && children[0].running &&
            grace_s > 0) {
          std::fprintf(stderr,
                       "ferry-launch: rank %d (pid %d) %s; rank 0 has %g s to end by itself "
                       "before the others are stopped\n",
                       c.rank, static_cast<int>(pid), describe_status(status).c_str(), grace_s);
          waiting_for_master = true;
          exit_code = 1;
          grace_deadline = std::chrono::steady_clock::now() +
                           std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
          continue;
        }
        if (waiting_for_master && !stopping && c.rank != 0) {
          // Most likely a consequence of the first loss; rank 0 is still the one to hear.
          if (failed) {
            std::fprintf(stderr, "ferry-launch: rank %d (pid %d) %s too\n", c.rank,
                         static_cast<int>(pid), describe_status(status).c_str());
          }
          continue;
        }
        if ((failed || waiting_for_master) && !stopping) {
          std::fprintf(stderr, "ferry-launch: rank %d (pid %d) %s; stopping the others\n", c.rank,
                       static_cast<int>(pid), describe_status(status).c_str());
          stop_all();
        }
      }
    }
    if (waiting_for_master && !stopping && std::chrono::steady_clock::now() > grace_deadline) {
      std::fprintf(stderr, "ferry-launch: rank 0 did not end within %g s; stopping the others\n",
                   grace_s);
      stop_all();
    }
    if (stopping && std::chrono::steady_clock::now() > stop_deadline) {
      for (auto& c : children) {
        if (c.running) kill(c.pid, SIGKILL);
      }
    }
  }
  for (auto& c : children) relay(c, true);
  return exit_code;
}
