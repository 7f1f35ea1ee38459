#include "pipeline/master_step.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "ferry/dist_autograd/context.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "pipeline/wire.h"

namespace ferry::pipeline {

using rpc::Error;
using rpc::ErrorKind;

// What reaches a step's loop from other threads.
struct Arrival {
  enum Kind { Output, BackwardDone, Failed } kind = Output;
  std::int64_t microbatch = 0;
  at::Tensor output;
  std::exception_ptr error;
};

class Inbox {
 public:
  void push(Arrival arrival) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(arrival));
    }
    ready_.notify_one();
  }
  // False if nothing arrived within `timeout`.
  bool pop(Arrival* out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!ready_.wait_for(lock, timeout, [this] { return !queue_.empty(); })) return false;
    *out = std::move(queue_.front());
    queue_.pop_front();
    return true;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Arrival> queue_;
};

namespace {

// The inboxes of the steps running in this process, by autograd context: an output that a failed
// step's stages still deliver finds no inbox and is dropped.
std::mutex inboxes_mutex;
std::map<std::int64_t, std::shared_ptr<Inbox>> inboxes;

// Pushes `Failed` if `call` fails; with `report_success`, `BackwardDone` when it succeeds.
void report_to(const std::shared_ptr<Inbox>& inbox, const rpc::FuturePtr& call,
               std::int64_t microbatch, bool report_success) {
  call->addCallback([inbox, microbatch, report_success](c10::ivalue::Future& f) {
    if (f.hasError()) {
      inbox->push({Arrival::Failed, microbatch, {}, f.exception_ptr()});
    } else if (report_success) {
      inbox->push({Arrival::BackwardDone, microbatch, {}, nullptr});
    }
  });
}

std::shared_ptr<Inbox> inbox_of(std::int64_t context) {
  std::lock_guard<std::mutex> lock(inboxes_mutex);
  auto it = inboxes.find(context);
  return it != inboxes.end() ? it->second : nullptr;
}

}  // namespace

void install_master_inbox(rpc::FunctionRegistry& registry) {
  registry.add("ferry.pipeline.output",
               [](std::int64_t, std::int64_t context, std::int64_t microbatch, at::Tensor out) {
                 if (auto inbox = inbox_of(context)) {
                   inbox->push({Arrival::Output, microbatch, std::move(out), nullptr});
                 }
               });
  registry.add("ferry.pipeline.failed",
               [](std::int64_t, std::int64_t context, std::int64_t microbatch, std::int64_t kind,
                  std::string message, std::string cause, std::string worker) {
                 if (kind < 0 || kind > static_cast<std::int64_t>(ErrorKind::OutOfMemory)) {
                   kind = static_cast<std::int64_t>(ErrorKind::RemoteException);
                 }
                 auto error = std::make_exception_ptr(Error(static_cast<ErrorKind>(kind), message,
                                                            std::move(cause), std::move(worker)));
                 if (auto inbox = inbox_of(context)) {
                   inbox->push({Arrival::Failed, microbatch, {}, error});
                 }
               });
}

void check_step_arguments(std::int64_t context, const at::Tensor& input, const at::Tensor& target) {
  if (context == 0) {
    throw Error(ErrorKind::InvalidArgument,
                "Pipeline::step needs an open ferry::dist_autograd::Context on this thread");
  }
  if (!input.defined() || input.dim() == 0 || input.size(0) == 0) {
    throw Error(ErrorKind::InvalidArgument, "Pipeline::step needs a batch of at least one sample");
  }
  if (!target.defined() || target.dim() == 0 || target.size(0) != input.size(0)) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("Pipeline::step: {} inputs but targets of shape {}", input.size(0),
                            target.defined() ? c10::str(target.sizes()) : "(none)"));
  }
}

MasterStep::MasterStep(Ends ends, std::int64_t context, const at::Tensor& input,
                       const at::Tensor& target, const Pipeline::Loss* loss, double loss_scale,
                       Schedule schedule, int microbatches, int step)
    : ends_(std::move(ends)),
      context_(context),
      loss_of_(loss),
      loss_scale_(loss_scale),
      step_(step),
      count_(static_cast<int>(std::min<std::int64_t>(microbatches, input.size(0)))),
      samples_(static_cast<double>(input.size(0))),
      schedule_(make_schedule(schedule, ends_.stages, count_)),
      inputs_(input.tensor_split(count_)),
      targets_(target.tensor_split(count_)),
      outputs_(count_),
      grads_(count_),
      input_sent_(count_),
      grad_sent_(count_),
      inbox_(std::make_shared<Inbox>()) {
  std::lock_guard<std::mutex> lock(inboxes_mutex);
  inboxes[context_] = inbox_;
}

MasterStep::~MasterStep() {
  std::lock_guard<std::mutex> lock(inboxes_mutex);
  inboxes.erase(context_);
}

void MasterStep::run(std::chrono::milliseconds patience) {
  if (ends_.loss_on_stage) send_targets();
  for (int m : schedule_->start()) send_forward(m);
  while (backwards_done_ < count_) {
    Arrival arrival;
    if (!inbox_->pop(&arrival, patience)) {
      throw Error(ErrorKind::Timeout,
                  fmt::format("pipeline step: nothing arrived for {} s ({} of {} outputs, {} "
                              "backwards done)",
                              std::chrono::duration_cast<std::chrono::seconds>(patience).count(),
                              outputs_in_, count_, backwards_done_));
    }
    const int m = static_cast<int>(arrival.microbatch);
    switch (arrival.kind) {
      case Arrival::Failed:
        rpc::rethrow_as(arrival.error, "pipeline step failed");
      case Arrival::Output:
        if (ends_.loss_on_stage) {
          // The micro-batch's share of the batch's loss, sent once its backward was done.
          loss_ += arrival.output.item<double>();
          ++outputs_in_;
          ++backwards_done_;
          if (std::optional<int> next = schedule_->on_backward_done()) send_forward(*next);
          break;
        }
        take_output(m, std::move(arrival.output));
        ++outputs_in_;
        for (int k : schedule_->on_output(m)) send_backward(k);
        break;
      case Arrival::BackwardDone:
        ++backwards_done_;
        if (std::optional<int> next = schedule_->on_backward_done()) send_forward(*next);
        break;
    }
  }
}

at::Tensor MasterStep::output() const {
  return ends_.loss_on_stage ? at::Tensor() : at::cat(outputs_);
}

void MasterStep::send_targets() {
  std::int64_t start = now_ns();
  // Answered at once: the targets are there before any forward reaches the last stage.
  rpc::rpc_sync(
      ends_.last_worker, "ferry.pipeline.targets",
      {ends_.pipeline, std::int64_t{ends_.stages - 1}, static_cast<std::int64_t>(samples_),
       loss_scale_, c10::List<at::Tensor>(targets_)});
  add_span(SpanKind::Send, 0, start);
}

void MasterStep::send_forward(int m) {
  input_sent_[m] = now_ns();
  auto call = rpc::rpc_async(
      ends_.first_worker, "ferry.pipeline.forward",
      {ends_.pipeline, std::int64_t{0}, std::int64_t{m}, c10::ivalue::Tuple::create({inputs_[m]})});
  add_span(SpanKind::Send, m, input_sent_[m]);
  report_to(inbox_, call, m, /*report_success=*/false);
}

void MasterStep::send_backward(int m) {
  grad_sent_[m] = now_ns();
  auto call = rpc::rpc_async(ends_.last_worker, "ferry.pipeline.backward",
                             {ends_.pipeline, std::int64_t{ends_.stages - 1}, std::int64_t{m},
                              c10::List<at::Tensor>({grads_[m]})});
  add_span(SpanKind::Send, m, grad_sent_[m]);
  report_to(inbox_, call, m, /*report_success=*/true);
}

void MasterStep::take_output(int m, at::Tensor out) {
  std::int64_t start = now_ns();
  at::Tensor leaf = out.requires_grad_();
  at::Tensor value;
  try {
    value = (*loss_of_)(leaf, targets_[m]);
  } catch (const c10::Error& e) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("the loss of micro-batch {} failed: {}", m,
                                                        e.what_without_backtrace()));
  }
  if (!value.defined() || value.numel() != 1 || !value.requires_grad()) {
    throw Error(
        ErrorKind::InvalidArgument,
        fmt::format("the loss of micro-batch {} must be a scalar computed from the output", m));
  }
  at::Tensor weighted = value.reshape({}) * (static_cast<double>(out.size(0)) / samples_);
  grads_[m] = torch::autograd::grad({weighted}, {leaf})[0];
  loss_ += weighted.item<double>();
  outputs_[m] = leaf.detach();
  add_span(SpanKind::Loss, m, start);
}

void MasterStep::add_span(SpanKind kind, int m, std::int64_t start_ns) {
  spans_.push_back({0, kind, step_, m, seconds(start_ns), seconds(now_ns())});
}

}  // namespace ferry::pipeline
