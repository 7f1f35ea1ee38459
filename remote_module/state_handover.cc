// Both sides of a stage's state handover: the master's calls and the workers' functions.
#include "ferry/remote_module/state_handover.h"

#include <fmt/format.h>

#include "ferry/remote_module/stage_here.h"
#include "ferry/rpc/parked.h"
#include "ferry/rpc/rpc.h"
#include "remote_module/installers.h"

namespace ferry::remote_module {
namespace {

constexpr const char* kTake = "ferry.stage.take_parked";
constexpr const char* kTakeSnapshotPart = "ferry.stage.take_snapshot_part";
constexpr std::int64_t kSnapshotPartBytes = std::int64_t{8} << 20;

void load_from_parks(const rpc::RRefPtr& module, const std::vector<rpc::RRefPtr>& parks) {
  std::vector<std::string> names;
  for (const auto& entry : stage_state_here(module)) names.push_back(entry.key());
  rpc::ParkedTensors state = rpc::gather_parked(parks, names, kTake);
  std::vector<std::string> missing;
  for (const std::string& name : names) {
    if (!state.contains(name)) missing.push_back(name);
  }
  if (!missing.empty()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("stage \"{}\" on worker \"{}\" found {} of its tensors in no "
                                 "park of the {} it was given: {}",
                                 stage_type_here(module), rpc::self().name, missing.size(),
                                 parks.size(), first_names(missing)));
  }
  load_stage_state_here(module, state, /*strict=*/true);
}

}  // namespace

void install_state_handover(rpc::FunctionRegistry& registry) {
  registry.add("ferry.stage.park", [](rpc::RRefPtr module) { return stage_state_here(module); });
  registry.add("ferry.stage.snapshot", [](rpc::RRefPtr module) {
    c10::Dict<std::string, at::Tensor> copy;
    for (const auto& item : stage_state_here(module)) {
      copy.insert(item.key(), item.value().to(at::kCPU, item.value().scalar_type(),
                                              /*non_blocking=*/false, /*copy=*/true));
    }
    return copy;
  });
  rpc::install_park_taker(registry, kTake);
  rpc::install_park_part_taker(registry, kTakeSnapshotPart);
  registry.add("ferry.stage.load_parked", [](rpc::RRefPtr module, c10::IValue parks) {
    load_from_parks(module, rpc::parks_of(parks));
  });
}

rpc::RRefPtr park_state(const RemoteModule& stage) { return park_states({stage}).front(); }

std::vector<rpc::RRefPtr> park_states(const std::vector<RemoteModule>& stages) {
  std::vector<rpc::RRefPtr> parks;
  for (const RemoteModule& stage : stages) {
    parks.push_back(
        rpc::remote(stage.worker(), "ferry.stage.park", {rpc::to_ivalue(stage.module_rref())}));
  }
  for (std::size_t k = 0; k < stages.size(); ++k) {
    try {
      parks[k]->ready()->wait();
    } catch (const std::exception&) {
      rpc::rethrow_as(std::current_exception(),
                      fmt::format("parking the state of stage \"{}\" on worker \"{}\" failed",
                                  stages[k].type(), stages[k].worker()));
    }
  }
  return parks;
}

rpc::RRefPtr snapshot_state(const RemoteModule& stage) {
  return rpc::remote(stage.worker(), "ferry.stage.snapshot", {rpc::to_ivalue(stage.module_rref())});
}

std::vector<c10::Dict<std::string, at::Tensor>> bring_snapshots(
    const std::vector<rpc::RRefPtr>& snapshots,
    const std::function<std::string(std::size_t)>& label) {
  return rpc::bring_parks(snapshots, kTakeSnapshotPart, kSnapshotPartBytes, label);
}

void load_parked_state(const RemoteModule& stage, const std::vector<rpc::RRefPtr>& parks) {
  try {
    rpc::rpc_sync(stage.worker(), "ferry.stage.load_parked",
                  {rpc::to_ivalue(stage.module_rref()), rpc::parks_value(parks)});
  } catch (const rpc::Error&) {
    rpc::rethrow_as(std::current_exception(),
                    fmt::format("loading parked state into stage \"{}\" on worker \"{}\" failed",
                                stage.type(), stage.worker()));
  }
}

}  // namespace ferry::remote_module
