// Runs entirely on the agent's loop thread: libuv calls every callback here from uv_run.
#include "rpc/connection.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <climits>
#include <utility>

#include "ferry/core/log.h"

namespace ferry::rpc {
namespace {

// Bytes pulled from the socket per read when no tensor is waiting for them.
constexpr size_t kBufferBytes = 64 * 1024;
// Below this, tensor bytes are read into the buffer with the frames around them and copied out:
// a syscall per small tensor would cost more than the copy.
constexpr size_t kDirectReadMin = 16 * 1024;
// While a large tensor streams in, the sender fills the socket about as fast as it is read, so
// reading again at once finds more: each such read saves a return to epoll and a thread wake-up,
// which on a virtual machine cost more than the copy. Bounded, so that one long transfer cannot
// keep the loop from its other connections for long.
constexpr int kMoreDirectReads = 64;

struct WriteRequest {
  uv_write_t req;
  EncodedFrame frame;
  std::uint64_t bytes = 0;  // of the frame still to write when the request was made
  std::vector<uv_buf_t> bufs;
};

// The buffers of `frame` from byte `offset` on.
std::vector<iovec> frame_buffers(EncodedFrame& frame, std::uint64_t offset) {
  std::vector<iovec> out;
  out.reserve(1 + frame.tensors.size());
  auto add = [&](char* data, std::uint64_t len) {
    if (offset >= len) {
      offset -= len;
      return;
    }
    out.push_back({data + offset, static_cast<size_t>(len - offset)});
    offset = 0;
  };
  add(frame.head.data(), frame.head.size());
  for (const at::Tensor& t : frame.tensors) {
    if (t.defined()) add(static_cast<char*>(const_cast<void*>(t.data_ptr())), t.nbytes());
  }
  return out;
}

}  // namespace

std::uint64_t SocketWriter::queued_bytes() {
  std::lock_guard<std::mutex> lock(mutex_);
  return queued_bytes_;
}

SocketWriter::Result SocketWriter::send(EncodedFrame& frame, Clock::time_point deadline) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    auto room = [&] {
      return !open_ || queued_bytes_ == 0 || queued_bytes_ + frame.size() <= max_queued_bytes_;
    };
    if (deadline != kNoBound && !drained_.wait_until(lock, deadline, room)) return Result::Full;
    if (!open_) return Result::Closed;
    if (loop_busy_ || !queue_.empty()) {
      queued_bytes_ += frame.size();
      queue_.push_back({std::move(frame), 0});
      // Already queued work means the loop was already asked to flush.
      if (queue_.size() > 1) return Result::Queued;
    } else {
      std::vector<iovec> bufs = frame_buffers(frame, 0);
      std::uint64_t written = 0;
      if (bufs.size() <= IOV_MAX) {
        msghdr msg{};
        msg.msg_iov = bufs.data();
        msg.msg_iovlen = bufs.size();
        // MSG_NOSIGNAL: a dead peer must fail the write, not raise SIGPIPE.
        ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) written = static_cast<std::uint64_t>(n);
      }
      if (written == frame.size()) return Result::Sent;
      // The rest goes through the loop, which also notices and reports a broken socket.
      loop_busy_ = true;
      queued_bytes_ += frame.size() - written;
      queue_.push_front({std::move(frame), written});
    }
  }
  wake_loop_(id_);
  return Result::Queued;
}

Connection::Connection(uv_loop_t* loop, std::uint64_t id, int outbound_rank, FrameLimits limits,
                       std::uint64_t max_queued_bytes, RRefCodec* rrefs,
                       ConnectionObserver* observer, std::function<void(std::uint64_t)> wake_loop)
    : id_(id),
      outbound_rank_(outbound_rank),
      observer_(observer),
      decoder_(limits, rrefs),
      writer_(std::make_shared<SocketWriter>(id, max_queued_bytes, std::move(wake_loop))),
      buffer_(new char[kBufferBytes]),
      holding_(outbound_rank >= 0) {
  uv_tcp_init(loop, &handle_);
  handle_.data = this;
}

Connection::~Connection() = default;

std::string Connection::remote_address() const {
  sockaddr_storage addr{};
  int len = sizeof addr;
  if (uv_tcp_getpeername(&handle_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&addr);
    uv_ip4_name(in, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
    uv_ip6_name(in6, host, sizeof host);
    port = ntohs(in6->sin6_port);
  }
  return fmt::format("{}:{}", host, port);
}

// A peer whose host vanishes (a cut link, a powered-off machine) sends no FIN: without these the
// kernel would keep the connection for minutes. Keepalive probes find an idle link gone in
// kKeepaliveIdleS + kKeepaliveCount * kKeepaliveIntervalS; kUnackedLimitMs closes a connection
// whose sent data nobody acknowledges. A live peer's kernel answers both even while the peer is
// busy, so neither fires for a slow peer.
constexpr int kKeepaliveIdleS = 2;
constexpr int kKeepaliveIntervalS = 1;
constexpr int kKeepaliveCount = 5;
constexpr unsigned kUnackedLimitMs = 10000;

int Connection::configure_socket() {
  if (int rc = uv_tcp_nodelay(&handle_, 1)) return rc;
  if (int rc = uv_tcp_keepalive(&handle_, 1, kKeepaliveIdleS)) return rc;
  uv_os_fd_t fd;
  if (int rc = uv_fileno(reinterpret_cast<uv_handle_t*>(&handle_), &fd)) return rc;
  int interval = kKeepaliveIntervalS, count = kKeepaliveCount;
  unsigned unacked = kUnackedLimitMs;
  if (setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count) != 0 ||
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &unacked, sizeof unacked) != 0) {
    return uv_translate_sys_error(errno);
  }
  return 0;
}

int Connection::start_reading() {
  return uv_read_start(reinterpret_cast<uv_stream_t*>(&handle_), &Connection::on_alloc,
                       &Connection::on_read);
}

int Connection::start_accepted() {
  if (int rc = configure_socket()) return rc;
  if (int rc = start_reading()) return rc;
  open_for_direct_writes();
  return 0;
}

void Connection::open_for_direct_writes() {
  uv_os_fd_t fd;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(&handle_), &fd) != 0) return;
  std::lock_guard<std::mutex> lock(writer_->mutex_);
  writer_->fd_ = fd;
  writer_->update_busy();
}

int Connection::start_connect(const std::string& host, int port) {
  sockaddr_storage addr{};
  int rc = uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in*>(&addr));
  if (rc != 0) rc = uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6*>(&addr));
  if (rc != 0) return rc;
  connect_req_.data = this;
  return uv_tcp_connect(&connect_req_, &handle_, reinterpret_cast<sockaddr*>(&addr),
                        &Connection::on_connect);
}

void Connection::on_connect(uv_connect_t* req, int status) {
  auto* self = static_cast<Connection*>(req->data);
  if (status == UV_ECANCELED || self->closing_) return;
  if (status < 0) {
    self->close(fmt::format("could not connect: {}", uv_strerror(status)));
    return;
  }
  int rc = self->configure_socket();
  if (rc == 0) rc = self->start_reading();
  if (rc != 0) {
    self->close(fmt::format("could not start reading: {}", uv_strerror(rc)));
    return;
  }
  self->open_for_direct_writes();
}

void Connection::write(EncodedFrame frame) {
  if (holding_) {
    if (!closing_) held_.push_back(std::move(frame));
    return;
  }
  write_now(std::move(frame));
}

void Connection::release() {
  holding_ = false;
  for (EncodedFrame& frame : std::exchange(held_, {})) write(std::move(frame));
}

void Connection::write_now(EncodedFrame frame) {
  {
    std::lock_guard<std::mutex> lock(writer_->mutex_);
    if (!writer_->open_) return;
    writer_->queued_bytes_ += frame.size();
    writer_->queue_.push_back({std::move(frame), 0});
  }
  flush();
}

void Connection::flush() {
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(writer_->mutex_);
    while (!closing_ && !writer_->queue_.empty()) {
      auto* request = new WriteRequest{};
      request->frame = std::move(writer_->queue_.front().frame);
      std::uint64_t offset = writer_->queue_.front().offset;
      request->bytes = request->frame.size() - offset;
      writer_->queue_.pop_front();
      request->req.data = request;
      for (const iovec& part : frame_buffers(request->frame, offset)) {
        uv_buf_t buf;
        // Set the size_t length directly: uv_buf_init takes an unsigned, too small past 4 GiB.
        buf.base = static_cast<char*>(part.iov_base);
        buf.len = part.iov_len;
        request->bufs.push_back(buf);
      }
      writer_->loop_busy_ = true;
      ++writer_->writes_in_flight_;
      int rc =
          uv_write(&request->req, reinterpret_cast<uv_stream_t*>(&handle_), request->bufs.data(),
                   static_cast<unsigned>(request->bufs.size()), &Connection::on_write);
      if (rc != 0) {
        --writer_->writes_in_flight_;
        writer_->queued_bytes_ -= request->bytes;
        delete request;
        failure = fmt::format("write failed: {}", uv_strerror(rc));
        break;
      }
    }
  }
  // close() takes the writer's lock itself.
  if (!failure.empty()) close(failure);
}

void Connection::on_write(uv_write_t* req, int status) {
  auto* request = static_cast<WriteRequest*>(req->data);
  auto* self = static_cast<Connection*>(req->handle->data);
  std::uint64_t bytes = request->bytes;
  delete request;
  SocketWriter& writer = *self->writer_;
  {
    std::lock_guard<std::mutex> lock(writer.mutex_);
    --writer.writes_in_flight_;
    writer.queued_bytes_ -= bytes;
    if (status >= 0) writer.update_busy();
  }
  writer.drained_.notify_all();
  if (status < 0 && status != UV_ECANCELED) {
    self->close(fmt::format("write failed: {}", uv_strerror(status)));
  }
}

void Connection::on_alloc(uv_handle_t* handle, size_t, uv_buf_t* buf) {
  auto* self = static_cast<Connection*>(handle->data);
  auto [target, missing] = self->decoder_.direct_target();
  if (target != nullptr && missing >= kDirectReadMin) {
    // The rest of this tensor goes straight into its memory; libuv reads again at once if the
    // socket holds more, so a large tensor arrives in a few big reads with no copy.
    self->direct_ = target;
    buf->base = target;
    buf->len = missing;
    return;
  }
  self->direct_ = nullptr;
  buf->base = self->buffer_.get();
  buf->len = kBufferBytes;
}

void Connection::on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  auto* self = static_cast<Connection*>(stream->data);
  if (nread == 0 || self->closing_) return;
  if (nread < 0) {
    self->close(nread == UV_EOF ? std::string("connection closed by peer")
                                : fmt::format("read failed: {}", uv_strerror(nread)));
    return;
  }
  self->observer_->on_bytes_read(static_cast<std::size_t>(nread));
  std::vector<Message> messages;
  try {
    if (self->direct_ != nullptr && buf->base == self->direct_) {
      self->decoder_.commit_direct(static_cast<size_t>(nread), &messages);
      self->read_more_directly(&messages);
    } else {
      self->decoder_.consume(buf->base, static_cast<size_t>(nread), &messages);
    }
  } catch (const Error& e) {
    log::warn("closing connection from {} ({}): bad frame: {}", self->remote_address(),
              self->peer_name_.empty() ? std::string("unidentified") : self->peer_name_, e.what());
    self->close(fmt::format("bad frame: {}", e.what()));
    return;
  }
  for (auto& message : messages) {
    if (self->closing_) return;
    self->observer_->on_message(*self, std::move(message));
  }
}

void Connection::read_more_directly(std::vector<Message>* messages) {
  uv_os_fd_t fd;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(&handle_), &fd) != 0) return;
  for (int i = 0; i < kMoreDirectReads; ++i) {
    auto [target, missing] = decoder_.direct_target();
    if (target == nullptr || missing < kDirectReadMin) return;
    ssize_t n = ::recv(fd, target, missing, MSG_DONTWAIT);
    // Nothing there yet, the end of the stream or an error: libuv's next read reports the last two.
    if (n <= 0) return;
    observer_->on_bytes_read(static_cast<std::size_t>(n));
    decoder_.commit_direct(static_cast<size_t>(n), messages);
  }
}

void Connection::close(const std::string& reason) {
  if (closing_) return;
  closing_ = true;
  close_reason_ = reason;
  {
    // From here on no thread writes to the socket, which uv_close is about to release.
    std::lock_guard<std::mutex> lock(writer_->mutex_);
    writer_->open_ = false;
    for (const auto& queued : writer_->queue_) {
      writer_->queued_bytes_ -= queued.frame.size() - queued.offset;
    }
    writer_->queue_.clear();
  }
  writer_->drained_.notify_all();
  held_.clear();
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&handle_));
  uv_close(reinterpret_cast<uv_handle_t*>(&handle_), &Connection::on_close);
}

void Connection::on_close(uv_handle_t* handle) {
  auto* self = static_cast<Connection*>(handle->data);
  self->observer_->on_closed(*self, self->close_reason_);
}

}  // namespace ferry::rpc
