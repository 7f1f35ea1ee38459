// The server's thread does all its I/O; the client is used from the benchmark's thread.
#include "bench/raw_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace ferry::bench {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

bool read_all(int fd, char* data, std::uint64_t n) {
  while (n > 0) {
    ssize_t r = ::read(fd, data, n);
    if (r <= 0) return false;
    data += r;
    n -= static_cast<std::uint64_t>(r);
  }
  return true;
}

bool write_all(int fd, const char* data, std::uint64_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
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
    std::uint64_t n = 0;
    while (read_all(fd, reinterpret_cast<char*>(&n), sizeof n)) {
      if (buffer.size() < n) buffer.resize(n);
      if (!read_all(fd, buffer.data(), n)) break;
      if (!write_all(fd, reinterpret_cast<char*>(&n), sizeof n) ||
          !write_all(fd, buffer.data(), n)) {
        break;
      }
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

void RawEchoClient::echo(std::vector<char>& buffer, std::uint64_t bytes) {
  if (buffer.size() < bytes) buffer.resize(bytes);
  // Header and body in one write, as the RPC frame goes out in one scatter/gather write.
  iovec parts[2] = {{&bytes, sizeof bytes}, {buffer.data(), bytes}};
  std::uint64_t total = sizeof bytes + bytes, sent = 0;
  while (sent < total) {
    ssize_t w = ::writev(fd_, parts, 2);
    if (w <= 0) fail("writev");
    sent += static_cast<std::uint64_t>(w);
    // Advance the iovecs past what was written.
    std::uint64_t skip = static_cast<std::uint64_t>(w);
    for (auto& p : parts) {
      std::uint64_t take = std::min<std::uint64_t>(skip, p.iov_len);
      p.iov_base = static_cast<char*>(p.iov_base) + take;
      p.iov_len -= take;
      skip -= take;
    }
  }
  std::uint64_t n = 0;
  if (!read_all(fd_, reinterpret_cast<char*>(&n), sizeof n) || n != bytes ||
      !read_all(fd_, buffer.data(), n)) {
    fail("echo read");
  }
}

}  // namespace ferry::bench
