#include "ferry/core/local_world.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>

namespace ferry::core {
namespace {

// Binds `port` (0: one the kernel chooses) on `host` and releases it; the port bound, or 0.
int try_bind(const std::string& host, int port, int* error) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof addr;
  bool ok = fd >= 0 && inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1 &&
            ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  *error = errno;
  if (fd >= 0) ::close(fd);
  return ok ? ntohs(addr.sin_port) : 0;
}

// The lowest port the kernel hands out for port 0, or 0 if it cannot be read.
int lowest_ephemeral_port() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  return in >> low ? low : 0;
}

}  // namespace

std::map<std::string, std::string> loopback_world_env(int rank, int world_size, int port,
                                                      const std::string& port_file) {
  std::map<std::string, std::string> env{{"RANK", std::to_string(rank)},
                                         {"WORLD_SIZE", std::to_string(world_size)},
                                         {"MASTER_ADDR", "127.0.0.1"},
                                         {"MASTER_PORT", std::to_string(port)}};
  if (!port_file.empty()) env["FERRY_MASTER_PORT_FILE"] = port_file;
  return env;
}

PortFile::PortFile() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ferry-world-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error(fmt::format("cannot make a folder for the master's port file ({}): {}",
                                         pattern, std::strerror(errno)));
  }
  folder_ = pattern;
  path_ = folder_ + "/master-port";
}

PortFile::~PortFile() {
  std::remove(path_.c_str());
  rmdir(folder_.c_str());
}

// A port from the kernel's ephemeral range can be handed to another socket bound to port 0 (an
// agent's listener, say) after this pick; clients of the store were then seen reaching that
// agent instead. So the port comes from just below that range, where no port-0 bind can land.
int pick_free_port(const std::string& host) {
  int error = 0;
  int low = lowest_ephemeral_port();
  int bottom = std::max(1024, low - 8192);
  if (low - 1 > bottom) {
    std::mt19937 random(std::random_device{}());
    std::uniform_int_distribution<int> candidate(bottom, low - 1);
    for (int attempt = 0; attempt < 200; ++attempt) {
      if (int port = try_bind(host, candidate(random), &error)) return port;
      if (error != EADDRINUSE) break;
    }
  }
  if (int port = try_bind(host, 0, &error)) return port;
  throw std::runtime_error(fmt::format("no free port on {}: {}", host, strerror(error)));
}

}  // namespace ferry::core
