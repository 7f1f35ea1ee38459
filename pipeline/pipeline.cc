// The master's side of a pipeline: it sends each micro-batch's input to the first stage, takes
// the last stage's output (the "ferry.pipeline.output" call, which lands in the step's inbox),
// computes the loss and its gradient here, and sends that gradient to the last stage. The
// schedule decides when: GPipe sends every input at once and every gradient once all outputs are
// in; 1F1B keeps at most p micro-batches in flight and sends each gradient as soon as it can.
#include "ferry/pipeline/pipeline.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>

#include "ferry/core/log.h"
#include "ferry/dist_autograd/context.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "pipeline/schedule.h"
#include "pipeline/stage_events.h"
#include "pipeline/wire.h"

namespace ferry {
namespace pipeline {
namespace {

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

// The inboxes of the steps running in this process, by autograd context: an output that a failed
// step's stages still deliver finds no inbox and is dropped.
std::mutex inboxes_mutex;
std::map<std::int64_t, std::shared_ptr<Inbox>> inboxes;

class InboxRegistration {
 public:
  InboxRegistration(std::int64_t context, std::shared_ptr<Inbox> inbox) : context_(context) {
    std::lock_guard<std::mutex> lock(inboxes_mutex);
    inboxes[context] = std::move(inbox);
  }
  ~InboxRegistration() {
    std::lock_guard<std::mutex> lock(inboxes_mutex);
    inboxes.erase(context_);
  }
  InboxRegistration(const InboxRegistration&) = delete;
  InboxRegistration& operator=(const InboxRegistration&) = delete;

 private:
  std::int64_t context_;
};

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

std::atomic<std::int64_t> pipeline_counter{1};

// The difference between `worker`'s steady clock and ours: the middle of the round trip that
// was quickest of a few.
// What Pipeline::step needs before it sends anything.
void check_step_arguments(std::int64_t context, const at::Tensor& input, const at::Tensor& target) {
  if (context == 0) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     "Pipeline::step needs an open ferry::dist_autograd::Context on this thread");
  }
  if (!input.defined() || input.dim() == 0 || input.size(0) == 0) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     "Pipeline::step needs a batch of at least one sample");
  }
  if (!target.defined() || target.dim() == 0 || target.size(0) != input.size(0)) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("Pipeline::step: {} inputs but targets of shape {}", input.size(0),
                                 target.defined() ? c10::str(target.sizes()) : "(none)"));
  }
}

std::int64_t clock_offset_ns(const std::string& worker) {
  std::int64_t best_rtt = std::numeric_limits<std::int64_t>::max();
  std::int64_t offset = 0;
  for (int i = 0; i < 5; ++i) {
    std::int64_t before = now_ns();
    std::int64_t theirs = rpc::rpc_sync(worker, "ferry.pipeline.clock", {}).toInt();
    std::int64_t after = now_ns();
    if (after - before < best_rtt) {
      best_rtt = after - before;
      offset = theirs - (before + after) / 2;
    }
  }
  return offset;
}

}  // namespace

void install_master_inbox(rpc::FunctionRegistry& registry) {
  registry.add("ferry.pipeline.output", [](std::int64_t, std::int64_t microbatch, at::Tensor out) {
    std::shared_ptr<Inbox> inbox;
    {
      std::lock_guard<std::mutex> lock(inboxes_mutex);
      auto it = inboxes.find(dist_autograd::current_context_id());
      if (it != inboxes.end()) inbox = it->second;
    }
    if (inbox) inbox->push({Arrival::Output, microbatch, std::move(out), nullptr});
  });
}

}  // namespace pipeline

using pipeline::now_ns;
using pipeline::seconds;
using pipeline::Span;
using pipeline::SpanKind;
using rpc::Error;
using rpc::ErrorKind;

Schedule parse_schedule(const std::string& name) {
  if (name == "gpipe") return Schedule::GPipe;
  if (name == "1f1b") return Schedule::OneFOneB;
  throw std::invalid_argument(
      fmt::format("unknown pipeline schedule \"{}\" (known: gpipe, 1f1b)", name));
}

const char* schedule_name(Schedule schedule) {
  return schedule == Schedule::GPipe ? "gpipe" : "1f1b";
}

Pipeline::Pipeline(std::vector<RemoteModule> stages, PipelineOptions options)
    : stages_(std::move(stages)), options_(std::move(options)) {
  const auto p = static_cast<std::int64_t>(stages_.size());
  if (p == 0) throw Error(ErrorKind::InvalidArgument, "a pipeline needs at least one stage");
  if (options_.microbatches < 1) {
    throw Error(
        ErrorKind::InvalidArgument,
        fmt::format("a pipeline needs at least one micro-batch, not {}", options_.microbatches));
  }
  std::vector<bool> checkpoint(stages_.size(), false);
  for (int s : options_.checkpoint_stages) {
    if (s < 0 || s >= p) {
      throw Error(
          ErrorKind::InvalidArgument,
          fmt::format("cannot checkpoint stage {}: the pipeline has stages 0 to {}", s, p - 1));
    }
    checkpoint[s] = true;
  }
  check_routes(options_.routes, stages_.size());
  c10::List<std::string> workers;
  for (const RemoteModule& stage : stages_) workers.push_back(stage.worker());
  const c10::IValue routes = routes_to_ivalue(options_.routes);
  id_ =
      (static_cast<std::int64_t>(rpc::self().rank) << 40) | pipeline::pipeline_counter.fetch_add(1);
  const std::string master = rpc::self().name;
  std::vector<rpc::FuturePtr> calls;
  std::vector<std::string> names;
  for (std::int64_t s = 0; s < p; ++s) {
    const RemoteModule& stage = stages_[s];
    // Under 1F1B stage s holds at most p - s micro-batches; GPipe holds them all.
    std::int64_t limit =
        options_.schedule == Schedule::OneFOneB ? p - s : std::numeric_limits<std::int64_t>::max();
    calls.push_back(rpc::rpc_async(
        stage.worker(), "ferry.pipeline.setup",
        {id_, s, p, rpc::to_ivalue(stage.module_rref()), s > 0 ? stages_[s - 1].worker() : master,
         s + 1 < p ? stages_[s + 1].worker() : master, master, limit,
         static_cast<bool>(checkpoint[s]), routes, workers}));
    names.push_back(fmt::format("stage {}: {} on {}", s,
                                static_cast<size_t>(s) < options_.stage_names.size()
                                    ? options_.stage_names[s]
                                    : stage.type(),
                                stage.worker()));
  }
  for (size_t s = 0; s < calls.size(); ++s) {
    calls[s]->wait();
    // A lost worker stays PeerDied (a spare may take over), a bad stage InvalidArgument.
    if (calls[s]->hasError()) {
      rpc::rethrow_as(calls[s]->exception_ptr(),
                      fmt::format("pipeline stage {} (\"{}\") on worker \"{}\" cannot take part", s,
                                  stages_[s].type(), stages_[s].worker()));
    }
  }
  std::map<std::string, std::int64_t> offsets;
  for (const RemoteModule& stage : stages_) {
    if (!offsets.count(stage.worker()))
      offsets[stage.worker()] = pipeline::clock_offset_ns(stage.worker());
    clock_offsets_ns_.push_back(offsets[stage.worker()]);
  }
  memory_base_.assign(stages_.size(), 0);
  memory_peaks();
  timeline_ = std::make_unique<pipeline::Timeline>(
      fmt::format("pipeline ({}, {} micro-batches)", schedule_name(options_.schedule),
                  options_.microbatches),
      std::move(names), options_.microbatches);
}

Pipeline::~Pipeline() {
  std::vector<rpc::FuturePtr> calls;
  try {
    for (const RemoteModule& stage : stages_) {
      calls.push_back(rpc::rpc_async(stage.worker(), "ferry.pipeline.teardown", {id_}));
    }
    for (auto& call : calls) call->wait();
  } catch (const std::exception& e) {
    log::debug("pipeline {}: teardown: {}", id_, e.what());
  }
}

void Pipeline::discard_step() {
  for (const RemoteModule& stage : stages_) {
    try {
      rpc::rpc_sync(stage.worker(), "ferry.pipeline.discard", {id_});
    } catch (const std::exception& e) {
      log::debug("pipeline {}: discard on {}: {}", id_, stage.worker(), e.what());
    }
  }
}

std::vector<Pipeline::StageMemory> Pipeline::memory_peaks() {
  std::vector<StageMemory> out;
  for (size_t s = 0; s < stages_.size(); ++s) {
    std::vector<std::int64_t> m = rpc::rpc_sync(stages_[s].worker(), "ferry.pipeline.memory",
                                                {id_, static_cast<std::int64_t>(s), true})
                                      .toIntVector();
    constexpr double kMiB = 1 << 20;
    out.push_back(
        {static_cast<double>(m[0]) / kMiB, static_cast<double>(m[2] - memory_base_[s]) / kMiB});
    memory_base_[s] = m[1];
  }
  return out;
}

Pipeline::StepResult Pipeline::step(const at::Tensor& input, const at::Tensor& target,
                                    const Loss& loss) {
  const std::int64_t context = dist_autograd::current_context_id();
  pipeline::check_step_arguments(context, input, target);
  const auto p = static_cast<int>(stages_.size());
  const int m_count =
      static_cast<int>(std::min<std::int64_t>(options_.microbatches, input.size(0)));
  const std::vector<at::Tensor> inputs = input.tensor_split(m_count);
  const std::vector<at::Tensor> targets = target.tensor_split(m_count);
  const double total = static_cast<double>(input.size(0));
  auto inbox = std::make_shared<pipeline::Inbox>();
  pipeline::InboxRegistration registration(context, inbox);

  const std::int64_t step_start = now_ns();
  const int step = timeline_->steps();
  std::vector<Span> spans;
  auto master_span = [&](SpanKind kind, int microbatch, std::int64_t start) {
    spans.push_back({0, kind, step, microbatch, seconds(start), seconds(now_ns())});
  };
  // When the master sent each micro-batch into the pipeline and its gradient back into it.
  std::vector<std::int64_t> input_sent(m_count), grad_sent(m_count);

  StepResult result;
  std::vector<at::Tensor> outputs(m_count), grads(m_count);
  std::unique_ptr<pipeline::MicrobatchSchedule> schedule =
      pipeline::make_schedule(options_.schedule, p, m_count);
  int outputs_in = 0, backwards_done = 0;
  auto send_forward = [&](int m) {
    input_sent[m] = now_ns();
    auto call = rpc::rpc_async(
        stages_.front().worker(), "ferry.pipeline.forward",
        {id_, std::int64_t{0}, std::int64_t{m}, c10::ivalue::Tuple::create({inputs[m]})});
    master_span(SpanKind::Send, m, input_sent[m]);
    pipeline::report_to(inbox, call, m, /*report_success=*/false);
  };
  auto send_backward = [&](int m) {
    grad_sent[m] = now_ns();
    auto call = rpc::rpc_async(
        stages_.back().worker(), "ferry.pipeline.backward",
        {id_, std::int64_t{p - 1}, std::int64_t{m}, c10::List<at::Tensor>({grads[m]})});
    master_span(SpanKind::Send, m, grad_sent[m]);
    pipeline::report_to(inbox, call, m, /*report_success=*/true);
  };
  auto take_output = [&](int m, at::Tensor out) {
    std::int64_t start = now_ns();
    at::Tensor leaf = out.requires_grad_();
    at::Tensor value;
    try {
      value = loss(leaf, targets[m]);
    } catch (const c10::Error& e) {
      throw Error(ErrorKind::InvalidArgument, fmt::format("the loss of micro-batch {} failed: {}",
                                                          m, e.what_without_backtrace()));
    }
    if (!value.defined() || value.numel() != 1 || !value.requires_grad()) {
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("the loss of micro-batch {} must be a scalar computed from the "
                              "output",
                              m));
    }
    at::Tensor weighted = value.reshape({}) * (static_cast<double>(out.size(0)) / total);
    grads[m] = torch::autograd::grad({weighted}, {leaf})[0];
    result.loss += weighted.item<double>();
    outputs[m] = leaf.detach();
    master_span(SpanKind::Loss, m, start);
  };

  const auto patience = rpc::agent().options().rpc_timeout + std::chrono::seconds(5);
  try {
    for (int m : schedule->start()) send_forward(m);
    while (backwards_done < m_count) {
      pipeline::Arrival arrival;
      if (!inbox->pop(&arrival, patience)) {
        throw Error(ErrorKind::Timeout,
                    fmt::format("pipeline step: nothing arrived for {} s ({} of {} outputs, {} "
                                "backwards done)",
                                std::chrono::duration_cast<std::chrono::seconds>(patience).count(),
                                outputs_in, m_count, backwards_done));
      }
      const int m = static_cast<int>(arrival.microbatch);
      switch (arrival.kind) {
        case pipeline::Arrival::Failed:
          rpc::rethrow_as(arrival.error, "pipeline step failed");
        case pipeline::Arrival::Output:
          take_output(m, std::move(arrival.output));
          ++outputs_in;
          for (int k : schedule->on_output(m)) send_backward(k);
          break;
        case pipeline::Arrival::BackwardDone:
          ++backwards_done;
          if (std::optional<int> next = schedule->on_backward_done()) send_forward(*next);
          break;
      }
    }
  } catch (...) {
    discard_step();
    throw;
  }
  const std::int64_t step_end = now_ns();

  std::vector<at::Tensor> events(p);
  for (int s = 0; s < p; ++s) {
    events[s] = rpc::rpc_sync(stages_[s].worker(), "ferry.pipeline.events", {id_, std::int64_t{s}})
                    .toTensor();
  }
  std::vector<Span> stages =
      pipeline::stage_spans(events, clock_offsets_ns_, input_sent, grad_sent, step);
  spans.insert(spans.end(), stages.begin(), stages.end());
  timeline_->add_step(std::move(spans), seconds(step_start), seconds(step_end));
  result.output = at::cat(outputs);
  return result;
}

}  // namespace ferry
