// Called from the agent's start-up and shutdown on user threads, and from wait_for_shutdown();
// the mutex serialises them because the store client is one socket.
#include "rpc/rendezvous.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "ferry/core/backoff.h"
#include "ferry/core/files.h"
#include "ferry/core/log.h"
#include "ferry/core/message_of.h"
#include "ferry/rpc/error.h"
#include "rpc/store_client.h"
#include "rpc/store_server.h"

namespace ferry::rpc {
namespace {

using Clock = std::chrono::steady_clock;

std::string seconds(std::chrono::milliseconds ms) {
  return fmt::format("{:.1f} s", ms.count() / 1000.0);
}

// On a rank other than 0 whose master port is 0: the port rank 0 wrote to the port file once its
// store listened.
int published_port(const Options& options) {
  int port = 0;
  auto read = [&] {
    try {
      port = std::stoi(core::read_whole_file(options.master_port_file));
    } catch (const std::exception&) {
      port = 0;  // not written yet
    }
    return port > 0 && port <= 65535;
  };
  if (!core::poll_with_backoff(read, Clock::now() + options.init_timeout)) {
    throw Error(ErrorKind::Init,
                fmt::format("rank {}: rank 0 did not write its port to {} within {}", options.rank,
                            options.master_port_file, seconds(options.init_timeout)));
  }
  return port;
}

}  // namespace

Rendezvous::Rendezvous(const Options& options)
    : rank_(options.rank), world_size_(options.world_size) {
  const int master_port =
      options.master_port == 0 && options.rank != 0 ? published_port(options) : options.master_port;
  if (options.rank == 0) {
    try {
      server_ = std::make_unique<store::StoreServer>(store::ServerSettings{
          options.master_port, options.secret, options.world_size, options.handshake_timeout});
    } catch (const std::exception& e) {
      throw Error(ErrorKind::Init, fmt::format("rank 0 could not host the rendezvous store on port "
                                               "{}: {}",
                                               options.master_port, core::message_of(e)));
    }
  }
  const int port = server_ ? server_->port() : master_port;
  try {
    store_ = std::make_unique<store::StoreClient>(
        store::ClientSettings{options.master_addr, port, options.rank, options.name, options.secret,
                              options.init_timeout},
        Clock::now() + options.init_timeout);
  } catch (const std::exception& e) {
    throw Error(
        ErrorKind::Init,
        fmt::format("rank {} could not reach the master at {}:{} within {}: {}", options.rank,
                    options.master_addr, port, seconds(options.init_timeout), core::message_of(e)));
  }
  port_ = port;
  if (options.rank == 0 && !options.master_port_file.empty()) {
    try {
      core::write_file_atomically(options.master_port_file, std::to_string(port_));
    } catch (const std::exception& e) {
      throw Error(ErrorKind::Init,
                  fmt::format("rank 0 could not publish its port: {}", core::message_of(e)));
    }
  }
}

Rendezvous::~Rendezvous() = default;

std::string Rendezvous::refusals(const std::vector<int>& ranks) {
  if (!server_) return {};
  std::string out;
  for (int r : ranks) {
    std::string why = server_->refusal_of(r);
    if (!why.empty())
      out += fmt::format("; the store refused a process claiming rank {} {}", r, why);
  }
  return out;
}

std::vector<WorkerInfo> Rendezvous::join(const WorkerInfo& self, Clock::time_point deadline) {
  std::vector<WorkerInfo> workers(world_size_);
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (store_->add(fmt::format("ferry/joins/{}", rank_), 1) > 1) {
      throw Error(ErrorKind::Init, fmt::format("rank {} joined twice (two processes were given "
                                               "rank {})",
                                               rank_, rank_));
    }
    store_->set(fmt::format("ferry/worker/{}", rank_),
                store::bytes_of(fmt::format("{}\n{}\n{}", self.name, self.host, self.port)));
    store_->add("ferry/joined", 1);
    if (!core::poll_with_backoff([&] { return store_->add("ferry/joined", 0) >= world_size_; },
                                 deadline)) {
      std::vector<int> missing;
      std::vector<std::string> present;
      for (int r = 0; r < world_size_; ++r) {
        if (store_->check({fmt::format("ferry/worker/{}", r)})) {
          present.push_back(std::to_string(r));
        } else {
          missing.push_back(r);
        }
      }
      throw Error(
          ErrorKind::Init,
          fmt::format("rank {}: the world of {} did not complete in time: rank{} {} "
                      "never joined (joined: {}){}",
                      rank_, world_size_, missing.size() == 1 ? "" : "s", fmt::join(missing, ", "),
                      fmt::join(present, ", "), refusals(missing)));
    }
    for (int r = 0; r < world_size_; ++r) {
      std::istringstream in(store::text_of(store_->get(fmt::format("ferry/worker/{}", r))));
      WorkerInfo& info = workers[r];
      std::string port;
      std::getline(in, info.name);
      std::getline(in, info.host);
      std::getline(in, port);
      info.rank = r;
      info.port = std::stoi(port);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorKind::Init,
                fmt::format("rank {}: rendezvous failed: {}", rank_, core::message_of(e)));
  }

  std::map<std::string, std::vector<int>> by_name;
  for (const auto& w : workers) by_name[w.name].push_back(w.rank);
  std::vector<std::string> clashes;
  for (const auto& [name, ranks] : by_name) {
    if (ranks.size() > 1) {
      clashes.push_back(fmt::format("\"{}\" is used by ranks {}", name, fmt::join(ranks, ", ")));
    }
  }
  if (!clashes.empty()) {
    throw Error(ErrorKind::Init, fmt::format("rank {}: worker names must be unique: {}", rank_,
                                             fmt::join(clashes, "; ")));
  }
  return workers;
}

void Rendezvous::arrive_shutdown() {
  std::lock_guard<std::mutex> lock(mutex_);
  store_->set(fmt::format("ferry/shutdown/{}", rank_), store::bytes_of("1"));
  store_->add("ferry/shutdown_started", 1);
}

bool Rendezvous::shutdown_started() {
  std::lock_guard<std::mutex> lock(mutex_);
  return store_->add("ferry/shutdown_started", 0) > 0;
}

std::vector<int> Rendezvous::missing_shutdown(const std::set<int>& lost) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> missing;
  if (store_->add("ferry/shutdown_started", 0) >= world_size_) return missing;
  // What one agent saw die, every agent stops waiting for.
  for (int r : lost) {
    if (published_lost_.insert(r).second)
      store_->set(fmt::format("ferry/lost/{}", r), store::bytes_of("1"));
  }
  for (int r = 0; r < world_size_; ++r) {
    if (!store_->check({fmt::format("ferry/shutdown/{}", r)}) &&
        !store_->check({fmt::format("ferry/lost/{}", r)})) {
      missing.push_back(r);
    }
  }
  return missing;
}

void Rendezvous::leave() {
  std::lock_guard<std::mutex> lock(mutex_);
  store_->set(fmt::format("ferry/left/{}", rank_), store::bytes_of("1"));
}

void Rendezvous::wait_left(const std::set<int>& ignore, Clock::time_point deadline) {
  core::poll_with_backoff(
      [&] {
        std::lock_guard<std::mutex> lock(mutex_);
        for (int r = 1; r < world_size_; ++r) {
          if (ignore.count(r) == 0 && !store_->check({fmt::format("ferry/left/{}", r)}) &&
              !store_->check({fmt::format("ferry/lost/{}", r)})) {
            return false;
          }
        }
        return true;
      },
      deadline);
}

std::string choose_listen_host(const std::string& master_addr, const std::string& ifname) {
  if (!ifname.empty()) {
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) != 0) {
      throw Error(ErrorKind::Init,
                  fmt::format("cannot list network interfaces: {}", strerror(errno)));
    }
    std::string found;
    std::vector<std::string> names;
    for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
      names.push_back(a->ifa_name);
      if (found.empty() && ifname == a->ifa_name) {
        char host[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, host,
                  sizeof host);
        found = host;
      }
    }
    freeifaddrs(list);
    if (found.empty()) {
      throw Error(
          ErrorKind::Init,
          fmt::format("interface \"{}\" (FERRY_IFNAME) has no IPv4 address; interfaces with "
                      "one: {}",
                      ifname, fmt::join(names, ", ")));
    }
    return found;
  }

  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  if (int rc = getaddrinfo(master_addr.c_str(), "9", &hints, &result); rc != 0) {
    throw Error(ErrorKind::Init, fmt::format("cannot resolve master address \"{}\": {}",
                                             master_addr, gai_strerror(rc)));
  }
  // Connecting a UDP socket sends nothing; it only asks the kernel which source address the route
  // to the master uses, which is the interface the master (and so the cluster) can reach us on.
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  std::string host;
  if (fd >= 0 && ::connect(fd, result->ai_addr, result->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf);
      host = buf;
    }
  }
  int saved = errno;
  if (fd >= 0) ::close(fd);
  freeaddrinfo(result);
  if (host.empty()) {
    throw Error(ErrorKind::Init,
                fmt::format("no route to master address \"{}\": {}", master_addr, strerror(saved)));
  }
  return host;
}

}  // namespace ferry::rpc
