// What an Agent is made of, private to rpc/: its settings and world, the loop thread's transport
// (listener, connections, writers), the calls it waits on, and its phase. The methods live in
// one file per room:
//   agent_transport.cc  the loop thread, listening, accepting, opening and closing connections
//   agent_handshake.cc  a connection's handshake (rpc/auth.h) and closing stalled ones
//   agent_calls.cc      sending calls, their answers, failures and deadlines
//   agent_serving.cc    serving requests on the pool, replies, remote references' calls
//   agent_shutdown.cc   draining own calls, the shutdown barrier, stopping
// and agent.cc is the public facade.
//
// Thread map: start(), call_*, shutdown() and wait_for_shutdown() run on user threads; every
// libuv callback (connections, accept, wake-up, deadline timer) runs on the loop thread; user
// functions and the completion of call_async futures run on pool threads. Shared state between
// them is the outgoing queue (queue_mutex), the writers (writers_mutex), the phase (start_mutex)
// and the pending calls (PendingCalls, thread-safe).
#pragma once

#include <uv.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ferry/rpc/agent.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/grad_observer.h"
#include "rpc/connection.h"
#include "rpc/frame.h"
#include "rpc/pending_calls.h"
#include "rpc/rendezvous.h"
#include "rpc/rref_context.h"
#include "rpc/thread_pool.h"

namespace ferry::rpc {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A call waiting for the loop thread to open a connection to its callee.
struct Outgoing {
  int to_rank = -1;
  std::uint64_t call_id = 0;
  EncodedFrame frame;
};

struct Agent::State : ConnectionObserver, std::enable_shared_from_this<Agent::State> {
  State(Options opts, FunctionRegistry& reg) : options(std::move(opts)), registry(reg) {}

  Options options;
  FunctionRegistry& registry;
  FunctionRegistry internal;  // the agent's own functions ("ferry.*"), apart from the user's
  // The registry that serves `function`: the agent's own where it has it, else the user's.
  const FunctionRegistry& registry_of(const std::string& function) const {
    return internal.contains(function) ? internal : registry;
  }
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

  // ---- transport (agent_transport.cc) -------------------------------------------------------
  void listen(const std::string& host);
  void check(int rc, const std::string& what);
  void start_loop();
  void stop_loop();
  // From any thread: hands a call to the loop thread, or asks it to flush a connection.
  void enqueue(Outgoing outgoing);
  void request_flush(std::uint64_t connection_id);
  Connection* new_connection(int outbound_rank);
  // Lets other threads send on `connection`; for an outbound one, only once its hello is queued,
  // so that nothing overtakes the hello.
  void publish_writer(Connection* connection);
  std::shared_ptr<SocketWriter> writer_for_rank(int rank);
  std::shared_ptr<SocketWriter> writer_for_connection(std::uint64_t id);
  static void on_wakeup(uv_async_t* handle);
  void send(Outgoing outgoing);
  // The open connection to `rank`, opened now if there is none. A connection that fails to
  // start is returned closing: its on_closed fails the calls assigned to it.
  Connection* outbound_to(int rank);
  static void on_accept(uv_stream_t* server, int status);
  static void on_timer(uv_timer_t* handle);
  void on_bytes_read(std::size_t n) override { bytes_read += n; }
  void on_closed(Connection& connection, const std::string& why) override;
  void close_all();

  // ---- handshake (agent_handshake.cc) -------------------------------------------------------
  void on_handshake(Connection& connection, const Message& message);
  // A stray or hostile client must not hold a connection open forever without a hello.
  void close_stalled_handshakes();

  // ---- calls (agent_calls.cc) ---------------------------------------------------------------
  FuturePtr call(const std::string& to, const std::string& function, std::vector<c10::IValue> args,
                 std::optional<std::chrono::milliseconds> timeout, bool complete_inline);
  int rank_of(const std::string& to, const std::string& function);
  // Peers may call this agent before its own start() has seen the world complete; their
  // functions' calls wait for that (bounded by the rendezvous) instead of failing.
  void await_running(const std::string& function);
  bool is_running();
  void set_phase(Phase next);
  FuturePtr call_rank(int rank, const std::string& function, std::vector<c10::IValue> args,
                      std::optional<std::chrono::milliseconds> timeout, bool complete_inline);
  // The agent is running (the caller checked).
  FuturePtr send_call(int rank, const std::string& function, std::vector<c10::IValue> args,
                      std::optional<std::chrono::milliseconds> timeout, bool complete_inline);
  // How long a sender may wait for room in a connection's queue; the loop thread never waits.
  Clock::time_point send_deadline(Clock::time_point wanted) const;
  Error unknown_worker(const std::string& name) const;
  void complete(PendingCall call, c10::IValue value);
  void fail(PendingCall call, const Error& error);
  void expire_deadlines();
  void on_message(Connection& connection, Message message) override;
  void answer(Message message);

  // ---- serving (agent_serving.cc) -----------------------------------------------------------
  void serve(std::uint64_t connection_id, int caller_rank, Message request);
  // Runs one request and replies when its future completes (pool thread, or the loop thread for
  // an inline function).
  void run_request(const std::weak_ptr<State>& weak, std::uint64_t connection_id, int caller_rank,
                   Message& request);
  void reply(std::uint64_t connection_id, int caller_rank, std::uint64_t id,
             const std::string& function, const GradTag& request_tag, c10::ivalue::Future& done);
  void start_rrefs();
  // Runs a user function on the pool and completes `future` as the function's own completes.
  void invoke_later(const std::string& function, std::vector<c10::IValue> args, FuturePtr future);

  // ---- shutdown (agent_shutdown.cc) ---------------------------------------------------------
  void drain_own_calls(Clock::time_point deadline);
  std::set<int> lost() { return calls.lost_ranks(); }
  void barrier(Clock::time_point deadline);
  void stop(bool graceful);
};

}  // namespace ferry::rpc
