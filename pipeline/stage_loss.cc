// The last stage of a pipeline when it computes the loss: it keeps the step's targets, computes
// each micro-batch's share of the batch's loss from its output, starts that micro-batch's
// backward itself and tells the master when it is done.
#include <fmt/format.h>
#include <torch/torch.h>

#include <exception>

#include "ferry/core/compute_thread.h"
#include "ferry/core/log.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "pipeline/stage_slot.h"

namespace ferry::pipeline {
namespace {

using rpc::Error;
using rpc::ErrorKind;

// Tells the master that the micro-batch's backward, which this stage started from its own loss,
// is done (with its loss share) or failed.
void report_own_backward(const Slot& slot, std::int64_t context, std::int64_t microbatch,
                         double loss_value, std::exception_ptr error) {
  try {
    if (error) {
      rpc::Failure failure = rpc::failure_of(error);
      rpc::rpc_async(slot.master, "ferry.pipeline.failed",
                     {slot.pipeline, context, microbatch, static_cast<std::int64_t>(failure.kind),
                      failure.message, failure.cause, failure.worker});
    } else {
      rpc::rpc_async(slot.master, "ferry.pipeline.output",
                     {slot.pipeline, context, microbatch,
                      at::scalar_tensor(loss_value, at::TensorOptions().dtype(at::kDouble))});
    }
  } catch (const std::exception& e) {
    // The master is gone or going: its step fails on its own deadline.
    log::debug("pipeline {}: cannot report micro-batch {}: {}", slot.pipeline, microbatch,
               e.what());
  }
}

// On the compute thread: the backward of a micro-batch from the loss this stage computed.
void run_own_backward(const SlotPtr& slot, std::int64_t context, std::int64_t microbatch) {
  double loss_value = 0;
  {
    std::lock_guard<std::mutex> lock(slot->mutex);
    auto it = slot->saved.find({context, microbatch});
    if (it != slot->saved.end()) loss_value = it->second.loss_value;
  }
  auto done = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  done->addCallback([slot, context, microbatch, loss_value](c10::ivalue::Future& f) {
    report_own_backward(*slot, context, microbatch, loss_value,
                        f.hasError() ? f.exception_ptr() : nullptr);
  });
  run_backward(slot, context, microbatch, {}, done);
}

}  // namespace

bool computes_loss(const Slot& slot) { return slot.loss && slot.index + 1 == slot.count; }

std::int64_t take_targets(Slot& slot, std::int64_t context, std::int64_t microbatch, Saved* saved) {
  std::lock_guard<std::mutex> lock(slot.mutex);
  auto it = slot.step_targets.find(context);
  if (it == slot.step_targets.end()) {
    throw Error(ErrorKind::InvalidArgument, "no targets arrived here for this step");
  }
  StepTargets& step = it->second;
  const auto count = static_cast<std::int64_t>(step.microbatches.size());
  if (microbatch < 0 || microbatch >= count) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("the step sent targets for {} micro-batches", count));
  }
  saved->target = step.microbatches[microbatch];
  saved->share = static_cast<double>(saved->target.size(0)) / step.samples;
  saved->scale = step.scale;
  if (++step.forwards_done < count) return 0;
  slot.step_targets.erase(it);
  return count;
}

at::Tensor loss_share(const Slot& slot, const c10::IValue& output, const Saved& saved) {
  return remote_module::scalar_loss(slot.loss_name, slot.loss, output.toTensor(), saved.target) *
         saved.share;
}

void start_own_backwards(const SlotPtr& slot, std::int64_t context, std::int64_t microbatch,
                         std::int64_t step_count) {
  std::vector<std::int64_t> order;
  if (slot->backward_at_once) {
    order.push_back(microbatch);
  } else {
    for (std::int64_t m = 0; m < step_count; ++m) order.push_back(m);
  }
  for (std::int64_t m : order) {
    core::post_to_compute_thread([slot, context, m] { run_own_backward(slot, context, m); });
  }
}

void install_stage_loss(rpc::FunctionRegistry& registry) {
  // The step's targets, split into its micro-batches, before any of its forwards reaches the
  // last stage; `samples` is the batch's size, `scale` what each loss counts in the gradients.
  registry.add(
      "ferry.pipeline.targets", [](std::int64_t pipeline, std::int64_t index, std::int64_t samples,
                                   double scale, std::vector<at::Tensor> targets) {
        std::int64_t context = context_or_throw("ferry.pipeline.targets");
        SlotPtr slot = slot_of(pipeline, index);
        if (!computes_loss(*slot)) {
          throw Error(ErrorKind::InvalidArgument,
                      fmt::format("stage {} of pipeline {} on worker \"{}\" computes no "
                                  "loss",
                                  index, pipeline, rpc::self().name));
        }
        if (samples <= 0 || targets.empty()) {
          throw Error(ErrorKind::InvalidArgument,
                      "ferry.pipeline.targets needs a batch of at least one sample");
        }
        std::lock_guard<std::mutex> lock(slot->mutex);
        slot->step_targets[context] = {std::move(targets), static_cast<double>(samples), scale, 0};
      });
}

}  // namespace ferry::pipeline
