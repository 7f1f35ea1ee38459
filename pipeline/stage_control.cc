// The functions through which a master sets up a stage's slot for a pipeline, reads what it
// recorded and held, and discards or tears it down. Each runs on a pool thread of the stage's
// worker.
#include <fmt/format.h>
#include <torch/torch.h>

#include "ferry/core/process_memory.h"
#include "ferry/remote_module/loss.h"
#include "ferry/remote_module/portal.h"
#include "ferry/remote_module/portal_flow.h"
#include "ferry/remote_module/stage_here.h"
#include "ferry/rpc/error.h"
#include "pipeline/stage_slot.h"

namespace ferry::pipeline {
namespace {

using rpc::Error;
using rpc::ErrorKind;

// Set-up, and what a failed step leaves behind.
void install_lifetime(rpc::FunctionRegistry& registry) {
  registry.add(
      "ferry.pipeline.setup",
      [](std::int64_t pipeline, std::int64_t index, std::int64_t count, rpc::RRefPtr module,
         std::string previous, std::string next, std::string master, std::int64_t limit,
         bool checkpoint, c10::IValue routes, std::vector<std::string> workers, std::string loss,
         bool backward_at_once, bool split_backward) {
        if (!module->isOwner()) {
          throw Error(ErrorKind::InvalidArgument,
                      fmt::format("stage {} of pipeline {} is not owned by worker "
                                  "\"{}\"",
                                  index, pipeline, rpc::self().name));
        }
        auto slot = std::make_shared<Slot>();
        slot->pipeline = pipeline;
        slot->index = index;
        slot->count = count;
        slot->module = module;
        slot->type = remote_module::stage_type_here(module);
        slot->previous = std::move(previous);
        slot->next = std::move(next);
        slot->master = std::move(master);
        slot->limit = limit;
        slot->checkpoint = checkpoint;
        slot->routes = remote_module::routes_from_ivalue(routes);
        slot->workers = std::move(workers);
        remote_module::check_routes(slot->routes, static_cast<size_t>(count));
        if (!loss.empty() && index + 1 == count) {
          slot->loss = remote_module::loss_function(loss);
          slot->loss_name = std::move(loss);
        }
        slot->backward_at_once = backward_at_once;
        slot->split_backward = split_backward;
        slots().put(pipeline, index, std::move(slot));
      });
  // After a failed step: what it left (kept graphs, parked forwards) goes; parked requests fail.
  registry.add("ferry.pipeline.discard", [](std::int64_t pipeline) {
    remote_module::drop_pipelined_portals();
    for (const SlotPtr& slot : slots().of(pipeline)) {
      std::vector<Parked> abandoned;
      std::vector<rpc::FuturePtr> waiting;
      {
        std::lock_guard<std::mutex> lock(slot->mutex);
        slot->saved.clear();
        slot->step_targets.clear();
        slot->activation_bytes = 0;
        slot->in_flight = 0;
        for (Parked& p : slot->parked) abandoned.push_back(std::move(p));
        slot->parked.clear();
        // A late request of this step fails at once.
        slot->forwards.abandon(&abandoned);
        slot->backwards.abandon(&abandoned);
        waiting = drop_deferred_weights(*slot);
      }
      for (rpc::FuturePtr& w : waiting) abandoned.push_back({nullptr, std::move(w)});
      fail_abandoned(abandoned);
    }
  });
  registry.add("ferry.pipeline.teardown", [](std::int64_t pipeline) { slots().erase(pipeline); });
}

// What a stage recorded and holds: its events, kept micro-batches, memory, and this clock.
void install_reports(rpc::FunctionRegistry& registry) {
  registry.add("ferry.pipeline.events", [](std::int64_t pipeline, std::int64_t index) {
    SlotPtr slot = slot_of(pipeline, index);
    std::vector<std::int64_t> events;
    {
      std::lock_guard<std::mutex> lock(slot->mutex);
      events.swap(slot->events);
    }
    auto n = static_cast<std::int64_t>(events.size()) / kEventFields;
    return torch::tensor(events, torch::kInt64).reshape({n, kEventFields});
  });
  // Micro-batches whose forward is kept, parked or waiting for its turn, or whose weight pass is
  // waiting, here, over every pipeline (for tests).
  registry.add("ferry.pipeline.kept", []() {
    std::int64_t kept = 0;
    for (const SlotPtr& slot : slots().all()) {
      std::lock_guard<std::mutex> lock(slot->mutex);
      kept += static_cast<std::int64_t>(slot->saved.size() + slot->parked.size() +
                                        slot->forwards.waiting() + slot->deferred.size());
    }
    return kept;
  });
  registry.add("ferry.pipeline.clock", []() { return now_ns(); });
  // The stage's activation peak and this process's tensor memory (live, peak); `reset` starts
  // new peaks from now.
  registry.add("ferry.pipeline.memory", [](std::int64_t pipeline, std::int64_t index, bool reset) {
    SlotPtr slot = slot_of(pipeline, index);
    std::int64_t activation_peak;
    {
      std::lock_guard<std::mutex> lock(slot->mutex);
      activation_peak = slot->activation_peak;
      if (reset) slot->activation_peak = slot->activation_bytes;
    }
    core::TensorMemory memory = core::tensor_memory();
    if (reset) core::reset_tensor_memory_peak();
    return std::vector<std::int64_t>{activation_peak, memory.live_bytes, memory.peak_bytes};
  });
}

}  // namespace

void install_stage_control(rpc::FunctionRegistry& registry) {
  install_lifetime(registry);
  install_reports(registry);
}

}  // namespace ferry::pipeline
