// Thread map: start(), call_*, shutdown() and wait_for_shutdown() run on user threads; every
// libuv callback (connections, accept, wake-up, deadline timer) runs on the loop thread; user
// functions and the completion of call_async futures run on pool threads. Shared state between
// them is the outgoing queue (queue_mutex) and the table of pending calls (PendingCalls).
#include "ferry/rpc/agent.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <uv.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "ferry/rpc/error.h"
#include "ferry/rpc/frame.h"
#include "ferry/rpc/grad_observer.h"
#include "ferry/rpc/log.h"
#include "ferry/rpc/thread_pool.h"
#include "rpc/auth.h"
#include "rpc/connection.h"
#include "rpc/pending_calls.h"
#include "rpc/rendezvous.h"
#include "rpc/rref_context.h"
#include "rpc/tensor_cache.h"

namespace ferry::rpc {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kDeadlineTick = std::chrono::milliseconds(10);

constexpr auto kSyncSpin = std::chrono::microseconds(200);

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A call waiting for the loop thread to open a connection to its callee.
struct Outgoing {
  int to_rank = -1;
  std::uint64_t call_id = 0;
  EncodedFrame frame;
};

std::string describe_exception(std::exception_ptr eptr, ErrorKind* kind) {
  *kind = ErrorKind::RemoteException;
  try {
    std::rethrow_exception(eptr);
  } catch (const Error& e) {
    *kind = e.kind();
    return e.what();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

FunctionRegistry& default_registry() {
  static FunctionRegistry registry;
  return registry;
}

struct Agent::State : ConnectionObserver, std::enable_shared_from_this<Agent::State> {
  State(Options opts, FunctionRegistry& reg) : options(std::move(opts)), registry(reg) {}

  Options options;
  FunctionRegistry& registry;
  FunctionRegistry internal;  // the agent's own functions ("ferry.*"), apart from the user's
  std::shared_ptr<RRefContext> rrefs;
  std::unique_ptr<Rendezvous> rendezvous;
  WorkerInfo self;
  std::vector<WorkerInfo> workers;
  std::map<std::string, int> rank_by_name;

  // Loop thread only, after start.
  uv_loop_t loop{};
  uv_async_t wakeup{};
  uv_timer_t timer{};
  uv_tcp_t listener{};
  std::thread loop_thread;
  std::map<std::uint64_t, std::unique_ptr<Connection>> connections;
  std::map<int, Connection*> outbound;
  std::uint64_t next_connection_id = 1;
  std::uint64_t ticks = 0;  // of the deadline timer

  std::mutex queue_mutex;
  std::vector<Outgoing> queue;
  std::vector<std::uint64_t> flush_requests;  // connections whose writer queued frames
  bool loop_stopping = false;

  // Writers of open connections, for threads that send directly (see SocketWriter).
  std::mutex writers_mutex;
  std::unordered_map<std::uint64_t, std::shared_ptr<SocketWriter>> writers_by_id;
  std::unordered_map<int, std::shared_ptr<SocketWriter>> writers_by_rank;

  // With the peers lost: the barrier does not wait for them, and later calls to them fail at once.
  PendingCalls calls;
  std::atomic<std::uint64_t> next_call_id{1};

  std::unique_ptr<ThreadPool> pool;
  std::atomic<std::uint64_t> payload_sent{0};  // bytes of requests and replies, frames included
  std::atomic<std::uint64_t> bytes_read{0};    // every byte read from a peer's connection
  enum class Phase { Starting, Running, Stopped };
  std::mutex start_mutex;
  std::condition_variable start_changed;
  Phase phase = Phase::Starting;
  std::mutex shutdown_mutex;
  bool shut_down = false;

  FrameLimits limits() const { return {options.max_frame_bytes, options.max_nesting_depth}; }

  // ---- start-up ----------------------------------------------------------------------------

  void listen(const std::string& host) {
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

  void check(int rc, const std::string& what) {
    if (rc != 0) {
      throw Error(ErrorKind::Init,
                  fmt::format("rank {}: {} failed: {}", options.rank, what, uv_strerror(rc)));
    }
  }

  void start_loop() {
    loop_thread = std::thread([this] {
      uv_run(&loop, UV_RUN_DEFAULT);
      uv_loop_close(&loop);
    });
  }

  void stop_loop() {
    {
      std::lock_guard<std::mutex> lock(queue_mutex);
      if (loop_stopping) return;
      loop_stopping = true;
      uv_async_send(&wakeup);
    }
    if (loop_thread.joinable()) loop_thread.join();
  }

  // ---- sending (user and pool threads) -------------------------------------------------------

  void enqueue(Outgoing outgoing) {
    std::lock_guard<std::mutex> lock(queue_mutex);
    if (loop_stopping) return;
    queue.push_back(std::move(outgoing));
    uv_async_send(&wakeup);
  }

  void request_flush(std::uint64_t connection_id) {
    std::lock_guard<std::mutex> lock(queue_mutex);
    if (loop_stopping) return;
    flush_requests.push_back(connection_id);
    uv_async_send(&wakeup);
  }

  Connection* new_connection(int outbound_rank) {
    auto connection = std::make_unique<Connection>(
        &loop, next_connection_id++, outbound_rank, limits(), options.max_queued_bytes, rrefs.get(),
        this, [this](std::uint64_t id) { request_flush(id); });
    Connection* raw = connection.get();
    connections.emplace(raw->id(), std::move(connection));
    return raw;
  }

  // Lets other threads send on `connection`; for an outbound one, only once its hello is queued,
  // so that nothing overtakes the hello.
  void publish_writer(Connection* connection) {
    std::lock_guard<std::mutex> lock(writers_mutex);
    writers_by_id[connection->id()] = connection->writer();
    if (connection->outbound_rank() >= 0) {
      writers_by_rank[connection->outbound_rank()] = connection->writer();
    }
  }

  std::shared_ptr<SocketWriter> writer_for_rank(int rank) {
    std::lock_guard<std::mutex> lock(writers_mutex);
    auto it = writers_by_rank.find(rank);
    return it == writers_by_rank.end() ? nullptr : it->second;
  }

  std::shared_ptr<SocketWriter> writer_for_connection(std::uint64_t id) {
    std::lock_guard<std::mutex> lock(writers_mutex);
    auto it = writers_by_id.find(id);
    return it == writers_by_id.end() ? nullptr : it->second;
  }

  FuturePtr call(const std::string& to, const std::string& function, std::vector<c10::IValue> args,
                 std::optional<std::chrono::milliseconds> timeout, bool complete_inline) {
    return send_call(rank_of(to, function), function, std::move(args), timeout, complete_inline);
  }

  int rank_of(const std::string& to, const std::string& function) {
    await_running(function);
    auto it = rank_by_name.find(to);
    if (it == rank_by_name.end()) throw unknown_worker(to);
    return it->second;
  }

  // Peers may call this agent before its own start() has seen the world complete; their
  // functions' calls wait for that (bounded by the rendezvous) instead of failing.
  void await_running(const std::string& function) {
    std::unique_lock<std::mutex> lock(start_mutex);
    start_changed.wait_until(lock, Clock::now() + options.init_timeout,
                             [this] { return phase != Phase::Starting; });
    if (phase != Phase::Running) {
      throw Error(
          ErrorKind::Shutdown,
          fmt::format("cannot call \"{}\": the agent of {} is not running", function, self.name));
    }
  }

  bool is_running() {
    std::lock_guard<std::mutex> lock(start_mutex);
    return phase == Phase::Running;
  }

  void set_phase(Phase next) {
    {
      std::lock_guard<std::mutex> lock(start_mutex);
      phase = next;
    }
    start_changed.notify_all();
  }

  FuturePtr call_rank(int rank, const std::string& function, std::vector<c10::IValue> args,
                      std::optional<std::chrono::milliseconds> timeout, bool complete_inline) {
    await_running(function);
    return send_call(rank, function, std::move(args), timeout, complete_inline);
  }

  // The agent is running (the caller checked).
  FuturePtr send_call(int rank, const std::string& function, std::vector<c10::IValue> args,
                      std::optional<std::chrono::milliseconds> timeout, bool complete_inline) {
    const WorkerInfo& callee = workers.at(rank);
    // A peer whose connection dropped is gone for this world: a new connection to a host behind
    // a cut link would only wait out the deadline.
    if (std::optional<std::string> why = calls.lost_reason(rank)) {
      auto failed = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
      failed->setError(std::make_exception_ptr(
          Error(ErrorKind::PeerDied, fmt::format("{} was lost ({}); call \"{}\" not sent",
                                                 callee.describe(), *why, function))));
      return failed;
    }

    Message request;
    request.kind = MessageKind::Request;
    request.id = next_call_id.fetch_add(1);
    request.function = function;
    request.value = c10::ivalue::Tuple::create(std::move(args));
    if (GradObserver* observer = grad_observer()) {
      request.grad = observer->on_send_request(function, request.value, callee.rank);
    }
    EncodedFrame frame;
    try {
      frame = encode_frame(request, options.max_nesting_depth, rrefs.get(), callee.rank);
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("arguments of call \"{}\" to {} cannot be sent: {}",
                                        function, callee.describe(), e.what()));
    }
    if (frame.size() > options.max_frame_bytes) {
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("call \"{}\" to {} is {} bytes, over the frame limit of {}", function,
                              callee.describe(), frame.size(), options.max_frame_bytes));
    }
    payload_sent += frame.size();

    PendingCall call;
    call.future = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    call.to_rank = callee.rank;
    call.function = function;
    call.start = Clock::now();
    call.deadline = call.start + timeout.value_or(options.rpc_timeout);
    call.complete_inline = complete_inline;
    FuturePtr future = call.future;
    Clock::time_point deadline = call.deadline;
    std::shared_ptr<SocketWriter> writer = writer_for_rank(callee.rank);
    call.connection_id = writer ? writer->id() : 0;
    calls.add(request.id, std::move(call));
    if (writer) {
      SocketWriter::Result sent = writer->send(frame, send_deadline(deadline));
      if (sent == SocketWriter::Result::Full) {
        if (std::optional<PendingCall> waited = calls.take(request.id)) {
          fail(std::move(*waited),
               Error(ErrorKind::Timeout,
                     fmt::format("call \"{}\" to {} could not be sent within its deadline: "
                                 "{:.0f} MiB were still queued to it (it reads slower than "
                                 "this process sends)",
                                 function, callee.describe(), writer->queued_bytes() / 1048576.0)));
        }
        return future;
      }
      if (sent != SocketWriter::Result::Closed) return future;
      // That connection is going away; the loop opens a new one.
      calls.assign(request.id, 0);
    }
    Outgoing outgoing;
    outgoing.to_rank = callee.rank;
    outgoing.call_id = request.id;
    outgoing.frame = std::move(frame);
    enqueue(std::move(outgoing));
    return future;
  }

  // How long a sender may wait for room in a connection's queue; the loop thread never waits.
  Clock::time_point send_deadline(Clock::time_point wanted) const {
    return std::this_thread::get_id() == loop_thread.get_id() ? SocketWriter::kNoBound : wanted;
  }

  Error unknown_worker(const std::string& name) const {
    std::vector<std::string> names;
    for (const auto& w : workers) names.push_back(w.name);
    return Error(ErrorKind::InvalidArgument, fmt::format("no worker is named \"{}\" (workers: {})",
                                                         name, fmt::join(names, ", ")));
  }

  // ---- completing calls (loop thread) ---------------------------------------------------------

  void complete(PendingCall call, c10::IValue value) {
    if (call.complete_inline) {
      call.future->markCompleted(std::move(value));
      return;
    }
    pool->submit([future = call.future, value = std::move(value)]() mutable {
      future->markCompleted(std::move(value));
    });
  }

  void fail(PendingCall call, const Error& error) {
    auto eptr = std::make_exception_ptr(error);
    if (call.complete_inline) {
      call.future->setError(eptr);
      return;
    }
    pool->submit([future = call.future, eptr] { future->setError(eptr); });
  }

  // ---- loop-thread callbacks -------------------------------------------------------------------

  static void on_wakeup(uv_async_t* handle) {
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

  void send(Outgoing outgoing) {
    Connection* connection = outbound_to(outgoing.to_rank);
    // Record which connection carries the call, so that losing it fails the call.
    if (!calls.assign(outgoing.call_id, connection->id())) return;  // timed out while queued
    connection->write(std::move(outgoing.frame));
  }

  // The open connection to `rank`, opened now if there is none. A connection that fails to
  // start is returned closing: its on_closed fails the calls assigned to it.
  Connection* outbound_to(int rank) {
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

  static void on_accept(uv_stream_t* server, int status) {
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

  // ---- handshake (loop thread; see rpc/auth.h) -------------------------------------------------

  void on_handshake(Connection& connection, const Message& message) {
    const Handshake& step = message.handshake;
    HandshakeState& state = connection.handshake();
    const std::string& secret = options.secret;
    if (connection.outbound_rank() >= 0) {
      if (step.step == HandshakeStep::Challenge && !state.hello_sent) {
        state.challenge = step.challenge;
        state.nonce = auth::fresh_nonce();
        state.hello_sent = true;
        Message hello;
        hello.kind = MessageKind::Control;
        hello.peer_name = self.name;
        hello.peer_rank = self.rank;
        hello.handshake = {
            HandshakeStep::Hello, state.challenge, state.nonce,
            auth::hello_proof(secret, state.challenge, state.nonce, self.rank, self.name)};
        connection.write_now(encode_frame(hello));
        return;
      }
      if (step.step == HandshakeStep::Welcome && state.hello_sent && !state.done) {
        if (!secret.empty() &&
            !auth::proofs_equal(auth::welcome_proof(secret, state.challenge, state.nonce),
                                step.proof)) {
          std::string who = workers.empty() ? fmt::format("rank {}", connection.outbound_rank())
                                            : workers[connection.outbound_rank()].describe();
          log::warn(
              "closing the connection to {} at {}: it did not prove that it holds the "
              "cluster secret",
              who, connection.remote_address());
          connection.close("it did not prove that it holds the cluster secret (FERRY_SECRET)");
          return;
        }
        state.done = true;
        connection.release();
        publish_writer(&connection);
        return;
      }
    } else if (step.step == HandshakeStep::Hello && !connection.identified()) {
      const char* fault =
          auth::hello_fault(secret, state.challenge, options.world_size, step.challenge, step.nonce,
                            step.proof, message.peer_rank, message.peer_name);
      if (fault != nullptr) {
        log::warn("rejected a connection from {} claiming to be \"{}\" (rank {}): {}",
                  connection.remote_address(), message.peer_name, message.peer_rank, fault);
        connection.close(fmt::format("rejected: {}", fault));
        return;
      }
      connection.set_peer(message.peer_name, message.peer_rank);
      state.nonce = step.nonce;
      state.done = true;
      Message welcome;
      welcome.kind = MessageKind::Control;
      welcome.handshake = {HandshakeStep::Welcome, state.challenge, state.nonce,
                           auth::welcome_proof(secret, state.challenge, state.nonce)};
      connection.write(encode_frame(welcome));
      return;
    }
    log::warn("closing connection from {}: handshake message out of order",
              connection.remote_address());
    connection.close("handshake message out of order");
  }

  // A stray or hostile client must not hold a connection open forever without a hello.
  void close_stalled_handshakes() {
    auto limit = Clock::now() - options.handshake_timeout;
    for (auto& [id, connection] : connections) {
      if (connection->outbound_rank() < 0 && !connection->identified() && !connection->closing() &&
          connection->handshake().opened_at < limit) {
        log::warn("closing connection from {}: no hello within {} ms", connection->remote_address(),
                  options.handshake_timeout.count());
        connection->close("no hello");
      }
    }
  }

  static void on_timer(uv_timer_t* handle) {
    auto* self = static_cast<State*>(handle->data);
    self->expire_deadlines();
    if (++self->ticks % 10 == 0) self->close_stalled_handshakes();
  }

  void expire_deadlines() {
    for (PendingCall& call : calls.take_expired(Clock::now())) {
      const WorkerInfo& callee = workers[call.to_rank];
      fail(std::move(call),
           Error(ErrorKind::Timeout,
                 fmt::format("call \"{}\" to {} timed out after {:.2f} s", call.function,
                             callee.describe(), seconds_since(call.start))));
    }
  }

  void on_bytes_read(std::size_t n) override { bytes_read += n; }

  void on_message(Connection& connection, Message message) override {
    switch (message.kind) {
      case MessageKind::Control:
        on_handshake(connection, message);
        return;
      case MessageKind::Request:
        if (!connection.identified()) {
          log::warn("closing connection from {}: request before hello",
                    connection.remote_address());
          connection.close("request before hello");
          return;
        }
        serve(connection.id(), connection.peer_rank(), std::move(message));
        return;
      case MessageKind::Response:
      case MessageKind::Error:
        if (connection.outbound_rank() < 0 || !connection.handshake().done) {
          connection.close("reply on a connection that sent no calls");
          return;
        }
        answer(std::move(message));
        return;
    }
  }

  void answer(Message message) {
    std::optional<PendingCall> call = calls.take(message.id);
    if (!call) {
      log::debug("late reply to call {} ignored (timed out or cancelled)", message.id);
      return;
    }
    if (message.kind == MessageKind::Response) {
      if (message.grad.valid()) {
        try {
          grad_observer()->on_receive(message.grad, message.value, call->to_rank);
        } catch (const std::exception& e) {
          fail(std::move(*call),
               Error(ErrorKind::InvalidArgument,
                     fmt::format("the result of call \"{}\" from {} could not be recorded for "
                                 "autograd: {}",
                                 call->function, workers[call->to_rank].describe(), e.what())));
          return;
        }
      }
      complete(std::move(*call), std::move(message.value));
      return;
    }
    const WorkerInfo& callee = workers[call->to_rank];
    std::string text = message.error_kind == ErrorKind::RemoteException
                           ? fmt::format("call \"{}\" on {} raised: {}", call->function,
                                         callee.describe(), message.error_message)
                           : fmt::format("call \"{}\" on {} failed: {}", call->function,
                                         callee.describe(), message.error_message);
    fail(std::move(*call), Error(message.error_kind, text, message.error_message));
  }

  void on_closed(Connection& connection, const std::string& why) override {
    std::uint64_t id = connection.id();
    // A peer that requires another secret closes the connection on our hello; say so.
    const HandshakeState& handshake = connection.handshake();
    std::string reason = connection.outbound_rank() >= 0 && handshake.hello_sent && !handshake.done
                             ? fmt::format(
                                   "{} during the handshake: it rejected this agent's "
                                   "hello (is FERRY_SECRET the same on both?)",
                                   why)
                             : why;
    int rank =
        connection.outbound_rank() >= 0 ? connection.outbound_rank() : connection.peer_rank();
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
      if (it != writers_by_rank.end() && it->second == connection.writer())
        writers_by_rank.erase(it);
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
                               call.function, seconds_since(call.start), reason)));
      }
    }
    if (!stopping && rank >= 0 && reason != "agent shutting down") {
      log::debug("connection {} to rank {} closed: {}", id, rank, reason);
    }
    connections.erase(id);
  }

  void close_all() {
    for (auto& [id, connection] : connections) connection->close("agent shutting down");
    uv_close(reinterpret_cast<uv_handle_t*>(&listener), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&timer), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&wakeup), nullptr);
  }

  // ---- serving (pool threads) ------------------------------------------------------------------

  void serve(std::uint64_t connection_id, int caller_rank, Message request) {
    std::weak_ptr<State> weak = weak_from_this();
    pool->submit([weak, connection_id, caller_rank, request = std::move(request)]() mutable {
      auto self = weak.lock();
      if (!self) return;
      FuturePtr result;
      std::vector<c10::IValue> args;
      GradObserver* observer = request.grad.valid() ? grad_observer() : nullptr;
      try {
        // A peer whose start() completed first may call before this agent knows the world;
        // functions (and the names of workers they use) wait for it.
        self->await_running(request.function);
        if (!request.value.isTuple()) {
          throw Error(ErrorKind::InvalidArgument, "the arguments of a request must be a tuple");
        }
        std::shared_ptr<void> in_context;
        if (observer) {
          observer->on_receive(request.grad, request.value, caller_rank);
          in_context = observer->enter(request.grad);
        }
        args = request.value.toTupleRef().elements().vec();
        bool internal = self->internal.contains(request.function);
        result = (internal ? self->internal : self->registry).invoke(request.function, args);
      } catch (...) {
        result = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
        result->setError(std::current_exception());
      }
      // The handler's future may complete on any thread, possibly after this agent is gone:
      // hold the state only weakly.
      result->addCallback([weak, connection_id, caller_rank, id = request.id,
                           function = request.function,
                           tag = observer ? request.grad : GradTag()](c10::ivalue::Future& done) {
        if (auto state = weak.lock()) {
          state->reply(connection_id, caller_rank, id, function, tag, done);
        }
      });
    });
  }

  void reply(std::uint64_t connection_id, int caller_rank, std::uint64_t id,
             const std::string& function, const GradTag& request_tag, c10::ivalue::Future& done) {
    Message response;
    response.id = id;
    response.error_worker = self.name;
    if (done.hasError()) {
      response.kind = MessageKind::Error;
      response.error_message = describe_exception(done.exception_ptr(), &response.error_kind);
    } else {
      response.kind = MessageKind::Response;
      response.value = done.value();
    }
    EncodedFrame frame;
    try {
      if (request_tag.valid() && response.kind == MessageKind::Response) {
        response.grad = grad_observer()->on_send_response(request_tag, response.value, caller_rank);
      }
      frame = encode_frame(response, options.max_nesting_depth, rrefs.get(), caller_rank);
    } catch (const std::exception& e) {
      response = Message();
      response.kind = MessageKind::Error;
      response.id = id;
      response.error_kind = ErrorKind::InvalidArgument;
      response.error_message =
          fmt::format("the result of \"{}\" cannot be sent: {}", function, e.what());
      response.error_worker = self.name;
      frame = encode_frame(response);
    }
    payload_sent += frame.size();
    std::shared_ptr<SocketWriter> writer = writer_for_connection(connection_id);
    SocketWriter::Result sent =
        writer ? writer->send(frame, send_deadline(Clock::now() + options.rpc_timeout))
               : SocketWriter::Result::Closed;
    if (sent == SocketWriter::Result::Closed) {
      log::debug("dropping the reply to call {}: its connection is gone", id);
    } else if (sent == SocketWriter::Result::Full) {
      log::warn(
          "dropping the reply to call {} (\"{}\") from {}: its connection's queue stayed "
          "full for {} ms",
          id, function, workers[caller_rank].describe(), options.rpc_timeout.count());
    }
  }

  // ---- remote references ----------------------------------------------------------------------

  void start_rrefs() {
    State* s = this;  // the context belongs to this state and never outlives it
    rrefs = std::make_shared<RRefContext>(
        self.rank,
        [s](int rank) {
          return rank >= 0 && rank < static_cast<int>(s->workers.size())
                     ? s->workers[rank].name
                     : fmt::format("rank {}", rank);
        },
        [s](int rank, const std::string& function, std::vector<c10::IValue> args,
            std::optional<std::chrono::milliseconds> timeout) {
          return s->call_rank(rank, function, std::move(args), timeout, false);
        },
        [s](const std::string& function, std::vector<c10::IValue> args, FuturePtr into) {
          s->invoke_later(function, std::move(args), std::move(into));
        });
    rrefs->register_functions(internal);
  }

  // Runs a user function on the pool and completes `future` as the function's own completes.
  void invoke_later(const std::string& function, std::vector<c10::IValue> args, FuturePtr future) {
    pool->submit([this, function, args = std::move(args), future]() mutable {
      FuturePtr result;
      try {
        result = registry.invoke(function, args);
      } catch (...) {
        future->setError(std::current_exception());
        return;
      }
      result->addCallback([future](c10::ivalue::Future& done) {
        if (done.hasError()) {
          future->setErrorIfNeeded(done.exception_ptr());
        } else {
          future->markCompleted(done.value());
        }
      });
    });
  }

  // ---- shutdown (user thread) ----------------------------------------------------------------

  void drain_own_calls(Clock::time_point deadline) {
    if (std::size_t left = calls.wait_until_empty(deadline)) {
      log::warn("shutdown: {} calls still pending at the deadline; they will be cancelled", left);
    }
  }

  std::set<int> lost() { return calls.lost_ranks(); }

  void barrier(Clock::time_point deadline) {
    rendezvous->arrive_shutdown();
    for (int attempt = 0;; ++attempt) {
      std::vector<int> missing = rendezvous->missing_shutdown(lost());
      if (missing.empty()) break;
      if (Clock::now() >= deadline) {
        std::vector<std::string> names;
        for (int r : missing) names.push_back(workers[r].describe());
        log::warn("shutdown: {} did not reach shutdown in time; going on without them",
                  fmt::join(names, ", "));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(5 + attempt * 5, 50)));
    }
    if (self.rank == 0) {
      // The store lives in this process: keep it up until the others are done reading it.
      rendezvous->wait_left(lost(), std::max(deadline, Clock::now() + std::chrono::seconds(1)));
    } else {
      rendezvous->leave();
    }
  }

  void stop(bool graceful) {
    std::lock_guard<std::mutex> lock(shutdown_mutex);
    if (shut_down) return;
    shut_down = true;
    auto deadline = Clock::now() + options.shutdown_timeout;
    if (graceful && is_running()) {
      drain_own_calls(deadline);
      try {
        barrier(deadline);
      } catch (const std::exception& e) {
        log::warn("shutdown: the rendezvous store is gone ({}); stopping without the barrier",
                  e.what());
      }
    }
    set_phase(Phase::Stopped);
    if (rrefs) rrefs->stop();
    stop_loop();
    for (PendingCall& call : calls.take_all()) {
      auto eptr = std::make_exception_ptr(
          Error(ErrorKind::Shutdown, fmt::format("call \"{}\" to {} was cancelled by shutdown",
                                                 call.function, workers[call.to_rank].describe())));
      call.future->setErrorIfNeeded(eptr);
    }
    pool.reset();
    rendezvous.reset();
  }
};

std::unique_ptr<Agent> Agent::start(Options options, FunctionRegistry& registry) {
  install_tensor_cache();
  // libuv writes with plain write(2): a peer that dies mid-write must fail that write, not kill
  // this process with SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  options = resolve_options(std::move(options));
  log::set_worker_name(options.name);
  auto state = std::make_shared<State>(options, registry);
  auto deadline = Clock::now() + options.init_timeout;
  state->self.name = options.name;
  state->self.rank = options.rank;
  // Before the rendezvous, which may wait for the master: a wrong interface is known at once.
  std::string host = choose_listen_host(options.master_addr, options.ifname);
  state->rendezvous = std::make_unique<Rendezvous>(options);
  state->options.master_port = state->rendezvous->port();
  state->pool = std::make_unique<ThreadPool>(options.num_threads);
  state->start_rrefs();
  state->listen(host);
  state->start_loop();
  try {
    state->workers = state->rendezvous->join(state->self, deadline);
  } catch (...) {
    state->stop(false);
    throw;
  }
  for (const auto& w : state->workers) state->rank_by_name[w.name] = w.rank;
  state->set_phase(State::Phase::Running);
  log::debug("joined as {} in a world of {}", state->self.describe(), options.world_size);
  if (options.secret.empty() && options.rank == 0) {
    log::warn(
        "the cluster is open: any process that reaches its ports may join and call "
        "functions; set FERRY_SECRET or --secret-file to require a shared secret");
  }
  return std::unique_ptr<Agent>(new Agent(std::move(state)));
}

Agent::Agent(std::shared_ptr<State> state) : state_(std::move(state)) {}

Agent::~Agent() {
  if (state_) state_->stop(false);
}

const WorkerInfo& Agent::self() const { return state_->self; }
const std::vector<WorkerInfo>& Agent::workers() const { return state_->workers; }
const Options& Agent::options() const { return state_->options; }
int Agent::master_port() const { return state_->options.master_port; }
bool Agent::running() const { return state_->is_running(); }

const WorkerInfo& Agent::worker(const std::string& name) const {
  auto it = state_->rank_by_name.find(name);
  if (it == state_->rank_by_name.end()) throw state_->unknown_worker(name);
  return state_->workers[it->second];
}

FuturePtr Agent::call_async(const std::string& to, const std::string& function,
                            std::vector<c10::IValue> args,
                            std::optional<std::chrono::milliseconds> timeout) {
  return state_->call(to, function, std::move(args), timeout, false);
}

c10::IValue Agent::call_sync(const std::string& to, const std::string& function,
                             std::vector<c10::IValue> args,
                             std::optional<std::chrono::milliseconds> timeout) {
  FuturePtr future = state_->call(to, function, std::move(args), timeout, true);
  // A small call usually answers within tens of microseconds; yielding until then spares the
  // sleep and wake-up that a blocking wait costs, which on virtual machines is most of a round
  // trip. Bounded, so a slow call blocks as usual.
  auto spin_until = Clock::now() + kSyncSpin;
  while (!future->completed() && Clock::now() < spin_until) std::this_thread::yield();
  future->wait();
  return future->value();
}

void Agent::shutdown(bool graceful) { state_->stop(graceful); }

std::uint64_t Agent::bytes_sent() const { return state_->payload_sent.load(); }
std::uint64_t Agent::bytes_received() const { return state_->bytes_read.load(); }

std::vector<std::string> Agent::lost_workers() const {
  std::vector<std::string> out;
  for (int rank : state_->calls.lost_ranks()) out.push_back(state_->workers[rank].name);
  return out;
}

RRefPtr Agent::remote(const std::string& to, const std::string& function,
                      std::vector<c10::IValue> args,
                      std::optional<std::chrono::milliseconds> timeout) {
  return state_->rrefs->remote(state_->rank_of(to, function), function, std::move(args), timeout);
}

std::size_t Agent::owned_rref_count() const { return state_->rrefs->owned_count(); }

void Agent::wait_for_shutdown() {
  for (;;) {
    if (!state_->is_running()) return;
    try {
      if (state_->rendezvous->shutdown_started()) break;
    } catch (const std::exception& e) {
      log::warn("the master's rendezvous store is unreachable ({}); stopping", e.what());
      state_->stop(false);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  state_->stop(true);
}

}  // namespace ferry::rpc
