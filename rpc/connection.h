// One TCP connection to a peer, carried by libuv. Resource type, owned by the Agent.
//
// Thread rules: every method, and every callback into ConnectionObserver, runs on the agent's
// loop thread. Nothing here may be touched from another thread.
#pragma once

#include <uv.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/rpc/frame.h"

namespace ferry::rpc {

class Connection;

class ConnectionObserver {
 public:
  virtual ~ConnectionObserver() = default;
  virtual void on_message(Connection& connection, Message message) = 0;
  // The handle is closed; the observer may destroy the connection now.
  virtual void on_closed(Connection& connection, const std::string& reason) = 0;
};

class Connection {
 public:
  // `outbound_rank` is the peer's rank for a connection we opened, -1 for one we accepted (its
  // peer is known once its hello arrives).
  Connection(uv_loop_t* loop, std::uint64_t id, int outbound_rank, FrameLimits limits,
             ConnectionObserver* observer);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  uv_tcp_t* handle() { return &handle_; }
  // Sets TCP options and starts reading an accepted socket.
  int start_accepted();
  // Starts connecting; frames written meanwhile go out once connected.
  int start_connect(const std::string& host, int port);
  // Queues a frame: one scatter/gather write of head and every tensor's memory.
  void write(EncodedFrame frame);
  // Closes once; on_closed follows with `reason`.
  void close(const std::string& reason);

  std::uint64_t id() const { return id_; }
  int outbound_rank() const { return outbound_rank_; }
  bool closing() const { return closing_; }
  const std::string& peer_name() const { return peer_name_; }
  int peer_rank() const { return peer_rank_; }
  void set_peer(const std::string& name, int rank) {
    peer_name_ = name;
    peer_rank_ = rank;
  }
  bool identified() const { return peer_rank_ >= 0; }
  std::string remote_address() const;

 private:
  static void on_alloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf);
  static void on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf);
  static void on_connect(uv_connect_t* req, int status);
  static void on_write(uv_write_t* req, int status);
  static void on_close(uv_handle_t* handle);
  int configure_socket();
  int start_reading();

  uv_tcp_t handle_;
  uv_connect_t connect_req_;
  std::uint64_t id_;
  int outbound_rank_;
  ConnectionObserver* observer_;
  FrameDecoder decoder_;
  std::unique_ptr<char[]> buffer_;
  char* direct_ = nullptr;  // where the last alloc pointed when it chose tensor memory
  bool closing_ = false;
  std::string close_reason_;
  std::string peer_name_;
  int peer_rank_ = -1;
};

}  // namespace ferry::rpc
