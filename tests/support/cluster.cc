#include "tests/support/cluster.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "ferry/core/files.h"
#include "ferry/core/local_world.h"
#include "ferry/core/processes.h"
#include "ferry/rpc/rpc.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_functions.h"
#include "tests/support/time_scale.h"

namespace ferry::testing {

Process::Process(const std::string& binary, const std::vector<std::string>& args,
                 const std::map<std::string, std::string>& env) {
  std::vector<std::string> command = {binary};
  command.insert(command.end(), args.begin(), args.end());
  pid_ = core::spawn_process(command, env);
}

Process::~Process() {
  if (!wait(std::chrono::milliseconds(0))) {
    kill(SIGKILL);
    wait(std::chrono::milliseconds(5000));
  }
}

void Process::kill(int signal) {
  if (!status_) ::kill(pid_, signal);
}

std::optional<int> Process::wait(std::chrono::milliseconds timeout) {
  if (!status_) status_ = core::wait_for_exit(pid_, scaled(timeout));
  return status_;
}

std::string read_file(const std::string& path) {
  try {
    return core::read_whole_file(path);
  } catch (const std::runtime_error&) {
    return "";
  }
}

int connect_raw(const rpc::WorkerInfo& to) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(to.port);
  inet_pton(AF_INET, to.host.c_str(), &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot connect to " + to.describe());
  }
  timeval limit{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  return fd;
}

int free_port() { return core::pick_free_port(); }

std::string new_port_file() {
  static std::atomic<int> worlds{0};
  return process_temp_dir().file("world-port-" + std::to_string(++worlds));
}

std::string peer_binary() { return FERRY_TEST_PEER; }

std::string worker_binary() { return FERRY_WORKER; }

namespace {

// Peers start LibTorch before they join: most of a second of CPU each, more under load.
std::chrono::milliseconds init_timeout() { return scaled(std::chrono::seconds(20)); }

void register_once() {
  static bool done = [] {
    register_test_functions(rpc::default_registry());
    return true;
  }();
  (void)done;
}

}  // namespace

// The master's store takes its port from the system as it opens; the peers read it from a file.
LocalWorld::LocalWorld(Settings settings) : settings_(std::move(settings)), port_(0) {
  const std::string port_file = new_port_file();
  int world = static_cast<int>(settings_.peer_names.size()) + 1;
  for (size_t i = 0; i < settings_.peer_names.size(); ++i) {
    std::map<std::string, std::string> env = settings_.env;
    auto own = settings_.env_of.find(settings_.peer_names[i]);
    if (own != settings_.env_of.end()) {
      for (const auto& [key, value] : own->second) env[key] = value;
    }
    for (auto& [key, value] :
         core::loopback_world_env(static_cast<int>(i) + 1, world, 0, port_file)) {
      env[key] = value;
    }
    std::vector<std::string> args = {"--name", settings_.peer_names[i], "--threads",
                                     std::to_string(settings_.threads)};
    if (settings_.use_ferry_worker) {
      args.insert(args.end(), settings_.worker_args.begin(), settings_.worker_args.end());
    } else {
      args.insert(args.end(),
                  {"--init-timeout-ms", std::to_string(init_timeout().count()), "--rpc-timeout-ms",
                   std::to_string(settings_.rpc_timeout.count()), "--shutdown-timeout-ms",
                   std::to_string(settings_.shutdown_timeout.count())});
    }
    peers_.push_back(std::make_unique<Process>(
        settings_.use_ferry_worker ? worker_binary() : peer_binary(), args, env));
  }
  rpc::Options options = rpc::loopback_options("master", 0, world, 0);
  options.master_port_file = port_file;
  options.num_threads = settings_.threads;
  options.rpc_timeout = settings_.rpc_timeout;
  options.init_timeout = init_timeout();
  options.shutdown_timeout = settings_.shutdown_timeout;
  options.secret = settings_.secret;
  options.handshake_timeout = settings_.handshake_timeout;
  register_once();
  rpc::init(options);
  port_ = rpc::agent().master_port();
}

std::vector<std::optional<int>> LocalWorld::finish() {
  std::vector<std::optional<int>> statuses;
  if (finished_) return statuses;
  finished_ = true;
  rpc::shutdown(true);
  for (auto& peer : peers_) {
    statuses.push_back(peer->wait(std::chrono::milliseconds(10000)));
    if (!statuses.back()) peer->kill(SIGKILL);
  }
  return statuses;
}

LocalWorld::~LocalWorld() { finish(); }

}  // namespace ferry::testing
