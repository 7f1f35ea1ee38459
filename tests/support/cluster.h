// Spawning and reaping the real processes of multi-process tests. Every wait is bounded and every
// process a test started is killed when its Process object goes away, so no test leaves
// processes behind or hangs on one.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/rpc/rpc.h"

namespace ferry::testing {

// A child process. Resource type.
class Process {
 public:
  Process(const std::string& binary, const std::vector<std::string>& args,
          const std::map<std::string, std::string>& env);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void kill(int signal);
  // The raw wait status, or nullopt if the process is still running after `timeout`, scaled as
  // every bound of the tests is (time_scale.h).
  std::optional<int> wait(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// The whole of a text file (a log, a small result); empty if it cannot be read.
std::string read_file(const std::string& path);

// A plain TCP socket connected to `to`'s agent, with a 5 s receive timeout: for tests that speak
// (or garble) the wire protocol by hand.
int connect_raw(const rpc::WorkerInfo& to);

// A free TCP port on 127.0.0.1 (bound and released; good enough for a test's rendezvous).
int free_port();

// A file no world of this test process has used: where a world's rank 0 writes the port its store
// got from the system and the other ranks read it (rpc::Options::master_port_file).
std::string new_port_file();

// The path of ferry-test-peer.
std::string peer_binary();
// The path of ferry-worker, the worker binary users run.
std::string worker_binary();

// A world on loopback: this test process is rank 0 ("master"), each peer a ferry-test-peer.
class LocalWorld {
 public:
  struct Settings {
    std::vector<std::string> peer_names = {"a", "b"};
    // Every peer gets these too, as the master does.
    std::chrono::milliseconds rpc_timeout{60000};
    std::chrono::milliseconds shutdown_timeout{5000};
    int threads = 4;
    // Peers are ferry-worker processes (stage functions, no test functions) instead.
    bool use_ferry_worker = false;
    // Extra arguments of every ferry-worker peer ("--plugin", path).
    std::vector<std::string> worker_args;
    // Extra environment of every peer.
    std::map<std::string, std::string> env;
    // Extra environment of one peer, by name, over `env`.
    std::map<std::string, std::map<std::string, std::string>> env_of;
    // The master's cluster secret (peers take theirs from FERRY_SECRET in `env`).
    std::string secret;
    std::chrono::milliseconds handshake_timeout{10000};
  };

  explicit LocalWorld(Settings settings);
  LocalWorld() : LocalWorld(Settings{}) {}
  // Shuts the master down gracefully, waits for peers (bounded), then kills what is left.
  ~LocalWorld();

  // The master is this process's default agent (ferry::rpc::agent()).
  rpc::Agent& master() { return rpc::agent(); }
  // Shuts the master down gracefully and waits (bounded) for every peer; returns their raw wait
  // statuses (nullopt: still running, then killed). The destructor does this if nobody did.
  std::vector<std::optional<int>> finish();
  Process& peer(size_t index) { return *peers_.at(index); }
  int port() const { return port_; }

 private:
  Settings settings_;
  int port_;
  std::vector<std::unique_ptr<Process>> peers_;
  bool finished_ = false;
};

}  // namespace ferry::testing
