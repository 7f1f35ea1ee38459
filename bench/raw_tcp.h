// Plain blocking TCP, the baseline every RPC figure is measured against: the same loopback, the
// same two processes, no framing beyond a length prefix. It is made as fast as this machine's
// loopback allows, so that a ratio against it says how much the RPC layer costs.
#pragma once

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace ferry::bench {

// Serves length-prefixed messages on every connection it accepts, from one thread: a message
// whose first byte of length prefix marks an echo is sent back whole; a stream message is only
// acknowledged with one byte. Resource type.
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
  // Sends `bytes` bytes one way and waits for the server's one-byte acknowledgement: what
  // iperf3 measures, the loopback's one-direction rate.
  void stream(std::vector<char>& buffer, std::uint64_t bytes);

 private:
  void send_message(std::vector<char>& buffer, std::uint64_t bytes, bool echo);
  int fd_ = -1;
};

}  // namespace ferry::bench
