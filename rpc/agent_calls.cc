// Calls this agent makes: sent straight on a connection's writer or through the loop thread,
// answered, failed or expired. Sending runs on user and pool threads; answers and deadlines on
// the loop thread.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ferry/core/log.h"
#include "rpc/agent_state.h"

namespace ferry::rpc {

FuturePtr Agent::State::call(const std::string& to, const std::string& function,
                             std::vector<c10::IValue> args,
                             std::optional<std::chrono::milliseconds> timeout,
                             bool complete_inline) {
  return send_call(rank_of(to, function), function, std::move(args), timeout, complete_inline);
}

int Agent::State::rank_of(const std::string& to, const std::string& function) {
  await_running(function);
  auto it = rank_by_name.find(to);
  if (it == rank_by_name.end()) throw unknown_worker(to);
  return it->second;
}

void Agent::State::await_running(const std::string& function) {
  std::unique_lock<std::mutex> lock(start_mutex);
  start_changed.wait_until(lock, Clock::now() + options.init_timeout,
                           [this] { return phase != Phase::Starting; });
  if (phase != Phase::Running) {
    throw Error(
        ErrorKind::Shutdown,
        fmt::format("cannot call \"{}\": the agent of {} is not running", function, self.name));
  }
}

bool Agent::State::is_running() {
  std::lock_guard<std::mutex> lock(start_mutex);
  return phase == Phase::Running;
}

void Agent::State::set_phase(Phase next) {
  {
    std::lock_guard<std::mutex> lock(start_mutex);
    phase = next;
  }
  start_changed.notify_all();
}

FuturePtr Agent::State::call_rank(int rank, const std::string& function,
                                  std::vector<c10::IValue> args,
                                  std::optional<std::chrono::milliseconds> timeout,
                                  bool complete_inline) {
  await_running(function);
  return send_call(rank, function, std::move(args), timeout, complete_inline);
}

FuturePtr Agent::State::send_call(int rank, const std::string& function,
                                  std::vector<c10::IValue> args,
                                  std::optional<std::chrono::milliseconds> timeout,
                                  bool complete_inline) {
  const WorkerInfo& callee = workers.at(rank);
  // A peer whose connection dropped is gone for this world: a new connection to a host behind
  // a cut link would only wait out the deadline.
  if (std::optional<std::string> why = calls.lost_reason(rank)) {
    auto failed = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    failed->setError(std::make_exception_ptr(Error(
        ErrorKind::PeerDied,
        fmt::format("{} was lost ({}); call \"{}\" not sent", callee.describe(), *why, function),
        "", callee.name)));
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
    throw e.restated(fmt::format("arguments of call \"{}\" to {} cannot be sent: {}", function,
                                 callee.describe(), e.what()));
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
                               function, callee.describe(), writer->queued_bytes() / 1048576.0),
                   "", callee.name));
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

Clock::time_point Agent::State::send_deadline(Clock::time_point wanted) const {
  return std::this_thread::get_id() == loop_thread.get_id() ? SocketWriter::kNoBound : wanted;
}

Error Agent::State::unknown_worker(const std::string& name) const {
  std::vector<std::string> names;
  for (const auto& w : workers) names.push_back(w.name);
  return Error(ErrorKind::InvalidArgument, fmt::format("no worker is named \"{}\" (workers: {})",
                                                       name, fmt::join(names, ", ")));
}

void Agent::State::complete(PendingCall call, c10::IValue value) {
  if (call.complete_inline) {
    call.future->markCompleted(std::move(value));
    return;
  }
  pool->submit([future = call.future, value = std::move(value)]() mutable {
    future->markCompleted(std::move(value));
  });
}

void Agent::State::fail(PendingCall call, const Error& error) {
  auto eptr = std::make_exception_ptr(error);
  if (call.complete_inline) {
    call.future->setError(eptr);
    return;
  }
  pool->submit([future = call.future, eptr] { future->setError(eptr); });
}

void Agent::State::expire_deadlines() {
  for (PendingCall& call : calls.take_expired(Clock::now())) {
    const WorkerInfo& callee = workers[call.to_rank];
    fail(std::move(call),
         Error(ErrorKind::Timeout,
               fmt::format("call \"{}\" to {} timed out after {:.2f} s", call.function,
                           callee.describe(), seconds_since(call.start)),
               "", callee.name));
  }
}

void Agent::State::on_message(Connection& connection, Message message) {
  switch (message.kind) {
    case MessageKind::Control:
      on_handshake(connection, message);
      return;
    case MessageKind::Request:
      if (!connection.identified()) {
        log::warn("closing connection from {}: request before hello", connection.remote_address());
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

void Agent::State::answer(Message message) {
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
                               call->function, workers[call->to_rank].describe(), e.what()),
                   "", workers[call->to_rank].name));
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
  fail(std::move(*call), Error(message.error_kind, text, message.error_message,
                               message.error_worker.empty() ? callee.name : message.error_worker));
}

}  // namespace ferry::rpc
