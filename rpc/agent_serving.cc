// Requests this agent serves: each runs on the pool (or, registered inline, on the loop thread),
// its reply goes back on the connection it came by; and the calls of remote references.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ferry/core/log.h"
#include "rpc/agent_state.h"

namespace ferry::rpc {

void Agent::State::serve(std::uint64_t connection_id, int caller_rank, Message request) {
  std::weak_ptr<State> weak = weak_from_this();
  // An inline handler runs here, on the loop thread, once the agent runs and when no gradient
  // bookkeeping comes with the call; anything else waits for nothing on this thread.
  bool here = !request.grad.valid() &&
              registry_of(request.function).runs_inline(request.function) && is_running();
  auto run = [weak, connection_id, caller_rank, request = std::move(request)]() mutable {
    if (auto self = weak.lock()) self->run_request(weak, connection_id, caller_rank, request);
  };
  if (here) {
    run();
  } else {
    pool->submit(std::move(run));
  }
}

void Agent::State::run_request(const std::weak_ptr<State>& weak, std::uint64_t connection_id,
                               int caller_rank, Message& request) {
  FuturePtr result;
  std::vector<c10::IValue> args;
  GradObserver* observer = request.grad.valid() ? grad_observer() : nullptr;
  try {
    // A peer whose start() completed first may call before this agent knows the world;
    // functions (and the names of workers they use) wait for it.
    await_running(request.function);
    if (!request.value.isTuple()) {
      throw Error(ErrorKind::InvalidArgument, "the arguments of a request must be a tuple");
    }
    std::shared_ptr<void> in_context;
    if (observer) {
      observer->on_receive(request.grad, request.value, caller_rank);
      in_context = observer->enter(request.grad);
    }
    args = request.value.toTupleRef().elements().vec();
    result = registry_of(request.function).invoke(request.function, args);
  } catch (...) {
    result = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    result->setError(std::current_exception());
  }
  // The handler's future may complete on any thread, possibly after this agent is gone:
  // hold the state only weakly.
  result->addCallback([weak, connection_id, caller_rank, id = request.id,
                       function = request.function,
                       tag = observer ? request.grad : GradTag()](c10::ivalue::Future& done) {
    if (auto state = weak.lock()) state->reply(connection_id, caller_rank, id, function, tag, done);
  });
}

void Agent::State::reply(std::uint64_t connection_id, int caller_rank, std::uint64_t id,
                         const std::string& function, const GradTag& request_tag,
                         c10::ivalue::Future& done) {
  Message response;
  response.id = id;
  response.error_worker = self.name;
  if (done.hasError()) {
    response.kind = MessageKind::Error;
    // The worker concerned stays the one an rpc error that came from further on names.
    Failure failure = failure_of(done.exception_ptr());
    response.error_kind = failure.kind;
    response.error_message = failure.message;
    if (!failure.worker.empty()) response.error_worker = failure.worker;
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

void Agent::State::start_rrefs() {
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
      },
      [s](FuturePtr value) {
        s->pool->submit([value = std::move(value)]() mutable { value.reset(); });
      });
  rrefs->register_functions(internal);
}

void Agent::State::invoke_later(const std::string& function, std::vector<c10::IValue> args,
                                FuturePtr future) {
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

}  // namespace ferry::rpc
