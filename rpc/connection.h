// One TCP connection to a peer, carried by libuv. Resource type, owned by the Agent.
//
// Thread rules: every Connection method, and every callback into ConnectionObserver, runs on the
// agent's loop thread. The one exception is the connection's SocketWriter, which any thread may
// use to send.
#pragma once

#include <uv.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rpc/frame.h"

namespace ferry::rpc {

class Connection;

// The sending half of a connection, shared with every thread that sends on it.
//
// A frame is written straight from the sending thread with one non-blocking writev when nothing
// is queued ahead of it: handing each frame to the loop thread would cost a thread wake-up on
// every call, which dominates a small round trip. Whatever the socket does not take at once
// goes to the front of the queue, and the loop thread writes the queue with uv_write while the
// socket drains. The mutex makes writes of whole frames exclusive, so bytes never interleave.
//
// Backpressure: frames hold their tensors until written, so a peer that reads slower than this
// process sends would make the queue grow without end. Past `max_queued_bytes` a sender waits
// until the socket has taken enough; a frame alone may exceed the bound.
class SocketWriter {
 public:
  enum class Result { Sent, Queued, Closed, Full };
  using Clock = std::chrono::steady_clock;

  SocketWriter(std::uint64_t id, std::uint64_t max_queued_bytes,
               std::function<void(std::uint64_t)> wake_loop)
      : id_(id), max_queued_bytes_(max_queued_bytes), wake_loop_(std::move(wake_loop)) {}
  std::uint64_t id() const { return id_; }
  // Takes the frame unless the result is Closed (the connection is gone) or Full (the queue
  // stayed over its bound until `deadline`). With kNoBound, takes it whatever the queue holds: the
  // loop thread must never wait, as it is the one that drains the queue.
  static constexpr Clock::time_point kNoBound = Clock::time_point::min();
  Result send(EncodedFrame& frame, Clock::time_point deadline);
  // Bytes of frames taken but not yet written.
  std::uint64_t queued_bytes();

 private:
  friend class Connection;
  struct Queued {
    EncodedFrame frame;
    std::uint64_t offset = 0;  // bytes of the frame already on the wire
  };

  const std::uint64_t id_;
  const std::uint64_t max_queued_bytes_;
  const std::function<void(std::uint64_t)> wake_loop_;  // asks the loop to flush this writer
  std::mutex mutex_;
  std::condition_variable drained_;
  std::uint64_t queued_bytes_ = 0;  // in queue_ and in uv_write requests not yet completed
  int fd_ = -1;                     // set once the socket is connected
  bool open_ = true;                // false from the moment the connection starts closing
  bool loop_busy_ = true;     // libuv holds unwritten bytes, or the socket is not connected yet
  int writes_in_flight_ = 0;  // uv_write requests whose callback has not run
  std::deque<Queued> queue_;

  // With the mutex held: direct writes may resume once libuv has nothing left to write.
  void update_busy() { loop_busy_ = fd_ < 0 || writes_in_flight_ > 0 || !queue_.empty(); }
};

class ConnectionObserver {
 public:
  virtual ~ConnectionObserver() = default;
  virtual void on_message(Connection& connection, Message message) = 0;
  // The handle is closed; the observer may destroy the connection now.
  virtual void on_closed(Connection& connection, const std::string& reason) = 0;
  // `n` bytes were read from the connection's socket (loop thread).
  virtual void on_bytes_read(std::size_t n) { (void)n; }
};

// Where a connection's handshake stands (see rpc/auth.h); the agent drives it.
struct HandshakeState {
  std::string challenge;  // the accepting side's nonce
  std::string nonce;      // the connecting side's nonce
  bool hello_sent = false;
  bool done = false;  // both sides are known; for an outbound connection, held frames went out
  std::chrono::steady_clock::time_point opened_at = std::chrono::steady_clock::now();
};

class Connection {
 public:
  // `outbound_rank` is the peer's rank for a connection we opened, -1 for one we accepted (its
  // peer is known once its hello arrives).
  Connection(uv_loop_t* loop, std::uint64_t id, int outbound_rank, FrameLimits limits,
             std::uint64_t max_queued_bytes, RRefCodec* rrefs, ConnectionObserver* observer,
             std::function<void(std::uint64_t)> wake_loop);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  uv_tcp_t* handle() { return &handle_; }
  // Sets TCP options and starts reading an accepted socket.
  int start_accepted();
  // Starts connecting; frames written meanwhile go out once connected.
  int start_connect(const std::string& host, int port);
  // Queues a frame behind anything queued and flushes. On an outbound connection, frames wait
  // until release(): nothing but the handshake goes to a peer that has not proved itself.
  void write(EncodedFrame frame);
  // Queues a frame and flushes even while frames are held: the handshake goes ahead of them.
  void write_now(EncodedFrame frame);
  // The handshake is done: held frames go out, in order.
  void release();
  HandshakeState& handshake() { return handshake_; }
  // Hands every queued frame to libuv: one scatter/gather uv_write of head and tensor memory each.
  void flush();
  const std::shared_ptr<SocketWriter>& writer() const { return writer_; }
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
  // After a read into tensor memory: reads on into it while the socket has bytes at once.
  void read_more_directly(std::vector<Message>* messages);
  static void on_connect(uv_connect_t* req, int status);
  static void on_write(uv_write_t* req, int status);
  static void on_close(uv_handle_t* handle);
  int configure_socket();
  int start_reading();
  // The socket is connected: sending threads may write to it directly from now on.
  void open_for_direct_writes();

  uv_tcp_t handle_;
  uv_connect_t connect_req_;
  std::uint64_t id_;
  int outbound_rank_;
  ConnectionObserver* observer_;
  FrameDecoder decoder_;
  std::shared_ptr<SocketWriter> writer_;
  std::unique_ptr<char[]> buffer_;
  char* direct_ = nullptr;  // where the last alloc pointed when it chose tensor memory
  bool closing_ = false;
  bool holding_;
  std::vector<EncodedFrame> held_;
  HandshakeState handshake_;
  std::string close_reason_;
  std::string peer_name_;
  int peer_rank_ = -1;
};

}  // namespace ferry::rpc
