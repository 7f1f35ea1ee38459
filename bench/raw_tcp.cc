// The server's thread does all its I/O; the client is used from the benchmark's thread.
#include "bench/raw_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace ferry::bench {
namespace {

// Writes go out in pieces of this size, as `iperf3 -l 1M` writes: the receiver copies each piece
// out of the socket while it is still in cache, which one 64 MiB write does not allow.
constexpr std::uint64_t kWriteBytes = 1 << 20;
// The top bit of the length prefix asks for the message back; without it the server only
// acknowledges.
constexpr std::uint64_t kEchoBit = std::uint64_t{1} << 63;

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

// MSG_WAITALL: one call and one wake-up per read rather than one per segment that arrived.
bool read_all(int fd, char* data, std::uint64_t n) {
  while (n > 0) {
    ssize_t r = ::recv(fd, data, n, MSG_WAITALL);
    if (r <= 0) return false;
    data += r;
    n -= static_cast<std::uint64_t>(r);
  }
  return true;
}

bool write_all(int fd, const char* data, std::uint64_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, data, std::min(n, kWriteBytes), MSG_NOSIGNAL);
    if (w <= 0) return false;
    data += w;
    n -= static_cast<std::uint64_t>(w);
  }
  return true;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Touches every page, so that no timed transfer pays for the first fault on its buffer.
void reserve(std::vector<char>& buffer, std::uint64_t bytes) {
  if (buffer.size() < bytes) buffer.resize(bytes, 1);
}

}  // namespace

RawEchoServer::RawEchoServer(const std::string& host) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  socklen_t len = sizeof addr;
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) fail("bind");
  if (::listen(listen_fd_, 4) != 0) fail("listen");
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
}

RawEchoServer::~RawEchoServer() {
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  thread_.join();
}

void RawEchoServer::serve() {
  std::vector<char> buffer;
  for (;;) {
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) return;
    set_nodelay(fd);
    std::uint64_t prefix = 0;
    while (read_all(fd, reinterpret_cast<char*>(&prefix), sizeof prefix)) {
      std::uint64_t n = prefix & ~kEchoBit;
      reserve(buffer, n);
      if (!read_all(fd, buffer.data(), n)) break;
      bool sent = (prefix & kEchoBit) != 0 ? write_all(fd, reinterpret_cast<char*>(&n), sizeof n) &&
                                                 write_all(fd, buffer.data(), n)
                                           : write_all(fd, "", 1);
      if (!sent) break;
    }
    ::close(fd);
  }
}

RawEchoClient::RawEchoClient(const std::string& host, int port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) fail("connect");
  set_nodelay(fd_);
}

RawEchoClient::~RawEchoClient() { ::close(fd_); }

void RawEchoClient::send_message(std::vector<char>& buffer, std::uint64_t bytes, bool echo) {
  reserve(buffer, bytes);
  std::uint64_t prefix = echo ? bytes | kEchoBit : bytes;
  // A small message goes out with its prefix in one write, as an RPC frame does.
  if (bytes <= 4096) {
    std::vector<char> whole(sizeof prefix + bytes);
    std::memcpy(whole.data(), &prefix, sizeof prefix);
    std::memcpy(whole.data() + sizeof prefix, buffer.data(), bytes);
    if (!write_all(fd_, whole.data(), whole.size())) fail("write");
    return;
  }
  if (!write_all(fd_, reinterpret_cast<char*>(&prefix), sizeof prefix) ||
      !write_all(fd_, buffer.data(), bytes)) {
    fail("write");
  }
}

void RawEchoClient::echo(std::vector<char>& buffer, std::uint64_t bytes) {
  send_message(buffer, bytes, true);
  std::uint64_t n = 0;
  if (!read_all(fd_, reinterpret_cast<char*>(&n), sizeof n) || n != bytes ||
      !read_all(fd_, buffer.data(), n)) {
    fail("echo read");
  }
}

void RawEchoClient::stream(std::vector<char>& buffer, std::uint64_t bytes) {
  send_message(buffer, bytes, false);
  char ack = 0;
  if (!read_all(fd_, &ack, 1)) fail("stream acknowledgement");
}

}  // namespace ferry::bench
