// The master's side of a pipeline: it sets its stages' workers up, drives each step
// (master_step.h), gathers what the stages recorded into the timeline, and tears them down.
#include "ferry/pipeline/pipeline.h"

#include <fmt/format.h>

#include <atomic>
#include <limits>
#include <map>
#include <stdexcept>

#include "ferry/core/log.h"
#include "ferry/dist_autograd/context.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/fan_out.h"
#include "ferry/rpc/rpc.h"
#include "pipeline/master_step.h"
#include "pipeline/stage_events.h"
#include "pipeline/wire.h"

namespace ferry::pipeline {

using rpc::Error;
using rpc::ErrorKind;

namespace {

std::atomic<std::int64_t> pipeline_counter{1};

// The difference between `worker`'s steady clock and ours: the middle of the round trip that
// was quickest of a few.
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

const core::EnumNames<Schedule>& schedule_names() {
  static const core::EnumNames<Schedule> names = {
      {Schedule::GPipe, "gpipe"}, {Schedule::OneFOneB, "1f1b"}, {Schedule::ZeroBubble, "zb"}};
  return names;
}

std::string schedule_name(Schedule schedule) { return core::name_of(schedule_names(), schedule); }

Pipeline::Pipeline(std::vector<remote_module::RemoteModule> stages, PipelineOptions options)
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
  remote_module::check_routes(options_.routes, stages_.size());
  c10::List<std::string> workers;
  for (const remote_module::RemoteModule& stage : stages_) workers.push_back(stage.worker());
  const c10::IValue routes = remote_module::routes_to_ivalue(options_.routes);
  id_ = (static_cast<std::int64_t>(rpc::self().rank) << 40) | pipeline_counter.fetch_add(1);
  const std::string master = rpc::self().name;
  // A lost worker stays PeerDied (a spare may take over), a bad stage InvalidArgument.
  rpc::FanOut calls;
  std::vector<std::string> names;
  const bool zero_bubble = options_.schedule == Schedule::ZeroBubble;
  const bool one_by_one = options_.schedule == Schedule::OneFOneB || zero_bubble;
  for (std::int64_t s = 0; s < p; ++s) {
    const remote_module::RemoteModule& stage = stages_[s];
    // Under 1F1B (and zb, those whose weight pass waits counted) stage s holds at most p - s
    // micro-batches; GPipe holds them all.
    std::int64_t limit = one_by_one ? p - s : std::numeric_limits<std::int64_t>::max();
    calls.call(
        stage.worker(), "ferry.pipeline.setup",
        {id_, s, p, rpc::to_ivalue(stage.module_rref()), s > 0 ? stages_[s - 1].worker() : master,
         s + 1 < p ? stages_[s + 1].worker() : master, master, limit,
         static_cast<bool>(checkpoint[s]), routes, workers, options_.loss, one_by_one, zero_bubble},
        fmt::format("pipeline stage {} (\"{}\") on worker \"{}\" cannot take part", s, stage.type(),
                    stage.worker()));
    names.push_back(fmt::format("stage {}: {} on {}", s,
                                static_cast<size_t>(s) < options_.stage_names.size()
                                    ? options_.stage_names[s]
                                    : stage.type(),
                                stage.worker()));
  }
  calls.wait();
  std::map<std::string, std::int64_t> offsets;
  for (const remote_module::RemoteModule& stage : stages_) {
    if (!offsets.count(stage.worker())) offsets[stage.worker()] = clock_offset_ns(stage.worker());
    clock_offsets_ns_.push_back(offsets[stage.worker()]);
  }
  memory_base_.assign(stages_.size(), 0);
  memory_peaks();
  timeline_ = std::make_unique<Timeline>(
      fmt::format("pipeline ({}, {} micro-batches)", schedule_name(options_.schedule),
                  options_.microbatches),
      std::move(names), options_.microbatches);
}

Pipeline::~Pipeline() {
  std::vector<rpc::FuturePtr> calls;
  try {
    for (const remote_module::RemoteModule& stage : stages_) {
      calls.push_back(rpc::rpc_async(stage.worker(), "ferry.pipeline.teardown", {id_}));
    }
    for (auto& call : calls) call->wait();
  } catch (const std::exception& e) {
    log::debug("pipeline {}: teardown: {}", id_, e.what());
  }
}

void Pipeline::wait_for_weight_passes() {
  rpc::FanOut calls;
  for (std::int64_t s = 0; s < static_cast<std::int64_t>(stages_.size()); ++s) {
    calls.call(stages_[s].worker(), "ferry.pipeline.weights", {id_, s},
               fmt::format("weight passes of stage {} on worker \"{}\"", s, stages_[s].worker()));
  }
  calls.wait();
}

void Pipeline::discard_step() {
  for (const remote_module::RemoteModule& stage : stages_) {
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
  if (!options_.loss.empty()) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("this pipeline's last stage computes the loss (\"{}\"): step without "
                            "a Loss function",
                            options_.loss));
  }
  return run_step(input, target, &loss, 1.0);
}

Pipeline::StepResult Pipeline::step(const at::Tensor& input, const at::Tensor& target,
                                    double loss_scale) {
  if (options_.loss.empty()) {
    throw Error(ErrorKind::InvalidArgument,
                "this pipeline's last stage computes no loss (PipelineOptions::loss is empty): "
                "step with a Loss function");
  }
  return run_step(input, target, nullptr, loss_scale);
}

Pipeline::StepResult Pipeline::run_step(const at::Tensor& input, const at::Tensor& target,
                                        const Loss* loss, double loss_scale) {
  const std::int64_t context = dist_autograd::current_context_id();
  check_step_arguments(context, input, target);
  const int p = static_cast<int>(stages_.size());
  const int step = timeline_->steps();
  MasterStep run({id_, stages_.front().worker(), stages_.back().worker(), p, loss == nullptr},
                 context, input, target, loss, loss_scale, options_.schedule, options_.microbatches,
                 step);
  const std::int64_t step_start = now_ns();
  try {
    run.run(rpc::agent().options().rpc_timeout + std::chrono::seconds(5));
    if (options_.schedule == Schedule::ZeroBubble) wait_for_weight_passes();
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
  std::vector<Span> spans = std::move(run.spans());
  std::vector<Span> stages =
      stage_spans(events, clock_offsets_ns_, run.input_sent(), run.grad_sent(), step);
  spans.insert(spans.end(), stages.begin(), stages.end());
  timeline_->add_step(std::move(spans), seconds(step_start), seconds(step_end));
  return {run.loss(), run.output()};
}

}  // namespace ferry::pipeline
