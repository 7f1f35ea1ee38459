// The agent's transport: the loop thread, its listener and wake-ups, outbound connections
// opened on demand, accepted ones, and what a closed connection leaves behind (its calls fail,
// its peer is lost). Runs on the loop thread except where a method says otherwise.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ferry/core/log.h"
#include "rpc/agent_state.h"
#include "rpc/auth.h"

namespace ferry::rpc {
namespace {

constexpr auto kDeadlineTick = std::chrono::milliseconds(10);

}  // namespace

void Agent::State::listen(const std::string& host) {
  check(uv_loop_init(&loop), "uv_loop_init");
  loop.data = this;
  check(uv_async_init(&loop, &wakeup, &State::on_wakeup), "uv_async_init");
  wakeup.data = this;
  check(uv_timer_init(&loop, &timer), "uv_timer_init");
  timer.data = this;
  check(uv_tcp_init(&loop, &listener), "uv_tcp_init");
  listener.data = this;
  sockaddr_in addr{};
  check(uv_ip4_addr(host.c_str(), 0, &addr), "uv_ip4_addr " + host);
  check(uv_tcp_bind(&listener, reinterpret_cast<sockaddr*>(&addr), 0), "bind to " + host);
  check(uv_listen(reinterpret_cast<uv_stream_t*>(&listener), 1024, &State::on_accept),
        "listen on " + host);
  sockaddr_in bound{};
  int len = sizeof bound;
  check(uv_tcp_getsockname(&listener, reinterpret_cast<sockaddr*>(&bound), &len), "getsockname");
  self.host = host;
  self.port = ntohs(bound.sin_port);
  auto tick = static_cast<std::uint64_t>(kDeadlineTick.count());
  check(uv_timer_start(&timer, &State::on_timer, tick, tick), "uv_timer_start");
}

void Agent::State::check(int rc, const std::string& what) {
  if (rc != 0) {
    throw Error(ErrorKind::Init,
                fmt::format("rank {}: {} failed: {}", options.rank, what, uv_strerror(rc)));
  }
}

void Agent::State::start_loop() {
  loop_thread = std::thread([this] {
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
  });
}

void Agent::State::stop_loop() {
  {
    std::lock_guard<std::mutex> lock(queue_mutex);
    if (loop_stopping) return;
    loop_stopping = true;
    uv_async_send(&wakeup);
  }
  if (loop_thread.joinable()) loop_thread.join();
}

void Agent::State::enqueue(Outgoing outgoing) {
  std::lock_guard<std::mutex> lock(queue_mutex);
  if (loop_stopping) return;
  queue.push_back(std::move(outgoing));
  uv_async_send(&wakeup);
}

void Agent::State::request_flush(std::uint64_t connection_id) {
  std::lock_guard<std::mutex> lock(queue_mutex);
  if (loop_stopping) return;
  flush_requests.push_back(connection_id);
  uv_async_send(&wakeup);
}

Connection* Agent::State::new_connection(int outbound_rank) {
  auto connection = std::make_unique<Connection>(
      &loop, next_connection_id++, outbound_rank, limits(), options.max_queued_bytes, rrefs.get(),
      this, [this](std::uint64_t id) { request_flush(id); });
  Connection* raw = connection.get();
  connections.emplace(raw->id(), std::move(connection));
  return raw;
}

void Agent::State::publish_writer(Connection* connection) {
  std::lock_guard<std::mutex> lock(writers_mutex);
  writers_by_id[connection->id()] = connection->writer();
  if (connection->outbound_rank() >= 0) {
    writers_by_rank[connection->outbound_rank()] = connection->writer();
  }
}

std::shared_ptr<SocketWriter> Agent::State::writer_for_rank(int rank) {
  std::lock_guard<std::mutex> lock(writers_mutex);
  auto it = writers_by_rank.find(rank);
  return it == writers_by_rank.end() ? nullptr : it->second;
}

std::shared_ptr<SocketWriter> Agent::State::writer_for_connection(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(writers_mutex);
  auto it = writers_by_id.find(id);
  return it == writers_by_id.end() ? nullptr : it->second;
}

void Agent::State::on_wakeup(uv_async_t* handle) {
  auto* self = static_cast<State*>(handle->data);
  std::vector<Outgoing> batch;
  std::vector<std::uint64_t> flushes;
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(self->queue_mutex);
    batch.swap(self->queue);
    flushes.swap(self->flush_requests);
    stopping = self->loop_stopping;
  }
  if (stopping) {
    self->close_all();
    return;
  }
  for (std::uint64_t id : flushes) {
    auto it = self->connections.find(id);
    if (it != self->connections.end()) it->second->flush();
  }
  for (auto& outgoing : batch) self->send(std::move(outgoing));
}

void Agent::State::send(Outgoing outgoing) {
  Connection* connection = outbound_to(outgoing.to_rank);
  // Record which connection carries the call, so that losing it fails the call.
  if (!calls.assign(outgoing.call_id, connection->id())) return;  // timed out while queued
  connection->write(std::move(outgoing.frame));
}

Connection* Agent::State::outbound_to(int rank) {
  auto it = outbound.find(rank);
  if (it != outbound.end() && !it->second->closing()) return it->second;
  const WorkerInfo& peer = workers[rank];
  Connection* raw = new_connection(rank);
  outbound[rank] = raw;
  int rc = raw->start_connect(peer.host, peer.port);
  if (rc != 0) {
    raw->close(fmt::format("could not connect: {}", uv_strerror(rc)));
  }
  // Calls written meanwhile wait in the connection until the handshake is done; its writer is
  // published only then.
  return raw;
}

void Agent::State::on_accept(uv_stream_t* server, int status) {
  auto* self = static_cast<State*>(server->data);
  if (status < 0) {
    log::warn("accept failed: {}", uv_strerror(status));
    return;
  }
  Connection* raw = self->new_connection(-1);
  int rc = uv_accept(server, reinterpret_cast<uv_stream_t*>(raw->handle()));
  if (rc == 0) rc = raw->start_accepted();
  if (rc != 0) {
    raw->close(fmt::format("accept failed: {}", uv_strerror(rc)));
    return;
  }
  Message challenge;
  challenge.kind = MessageKind::Control;
  challenge.handshake.step = HandshakeStep::Challenge;
  challenge.handshake.challenge = raw->handshake().challenge = auth::fresh_nonce();
  raw->write(encode_frame(challenge));
  // Replies go by connection; only an identified peer's requests are ever served.
  self->publish_writer(raw);
}

void Agent::State::on_timer(uv_timer_t* handle) {
  auto* self = static_cast<State*>(handle->data);
  self->expire_deadlines();
  if (++self->ticks % 10 == 0) self->close_stalled_handshakes();
}

void Agent::State::on_closed(Connection& connection, const std::string& why) {
  std::uint64_t id = connection.id();
  // A peer that requires another secret closes the connection on our hello; say so.
  const HandshakeState& handshake = connection.handshake();
  std::string reason = connection.outbound_rank() >= 0 && handshake.hello_sent && !handshake.done
                           ? fmt::format(
                                 "{} during the handshake: it rejected this agent's "
                                 "hello (is FERRY_SECRET the same on both?)",
                                 why)
                           : why;
  int rank = connection.outbound_rank() >= 0 ? connection.outbound_rank() : connection.peer_rank();
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(queue_mutex);
    stopping = loop_stopping;
  }
  if (connection.outbound_rank() >= 0) {
    auto it = outbound.find(connection.outbound_rank());
    if (it != outbound.end() && it->second == &connection) outbound.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(writers_mutex);
    writers_by_id.erase(id);
    auto it = writers_by_rank.find(connection.outbound_rank());
    if (it != writers_by_rank.end() && it->second == connection.writer()) writers_by_rank.erase(it);
  }
  if (rank >= 0 && !stopping) calls.mark_lost(rank, reason);
  for (PendingCall& call : calls.take_on_connection(id)) {
    const WorkerInfo& callee = workers[call.to_rank];
    if (stopping) {
      fail(std::move(call),
           Error(ErrorKind::Shutdown, fmt::format("call \"{}\" to {} was cancelled by shutdown",
                                                  call.function, callee.describe())));
    } else {
      fail(std::move(call),
           Error(ErrorKind::PeerDied,
                 fmt::format("{} died during call \"{}\" after {:.2f} s ({})", callee.describe(),
                             call.function, seconds_since(call.start), reason),
                 "", callee.name));
    }
  }
  if (!stopping && rank >= 0 && reason != "agent shutting down") {
    log::debug("connection {} to rank {} closed: {}", id, rank, reason);
  }
  connections.erase(id);
}

void Agent::State::close_all() {
  for (auto& [id, connection] : connections) connection->close("agent shutting down");
  uv_close(reinterpret_cast<uv_handle_t*>(&listener), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&wakeup), nullptr);
}

}  // namespace ferry::rpc
