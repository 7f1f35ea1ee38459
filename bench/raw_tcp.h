// Plain blocking TCP, the baseline every RPC figure is measured against: the same loopback, the
// same two processes, no framing beyond a length prefix.
#pragma once

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace ferry::bench {

// Echoes length-prefixed messages on every connection it accepts, from one thread. Resource type.
class RawEchoServer {
 public:
  explicit RawEchoServer(const std::string& host);
  ~RawEchoServer();
  int port() const { return port_; }

 private:
  void serve();
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

// One connection to a RawEchoServer. Resource type.
class RawEchoClient {
 public:
  RawEchoClient(const std::string& host, int port);
  ~RawEchoClient();
  // Sends `bytes` bytes and waits until the server has echoed them all back.
  void echo(std::vector<char>& buffer, std::uint64_t bytes);

 private:
  int fd_ = -1;
};

}  // namespace ferry::bench
