#include "trainer/placement.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "ferry/core/process_memory.h"
#include "ferry/models/unet_blocks.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"

namespace ferry::trainer {
std::vector<std::string> replica_stage_names(const StagePlan& plan, int replicas) {
  std::vector<std::string> out;
  for (int r = 0; r < replicas; ++r) {
    for (const auto& stage : plan.stages) {
      out.push_back(r == 0 ? stage.name : fmt::format("{}@{}", stage.name, r));
    }
  }
  return out;
}

std::vector<std::string> world_names() {
  std::vector<std::string> names;
  for (const auto& w : rpc::workers()) names.push_back(w.name);
  return names;
}

std::vector<std::string> place_stages(const StagePlan& plan, const std::string& placement,
                                      int spares, int replicas,
                                      const std::vector<std::string>& world) {
  std::vector<std::string> names = world;
  if (spares > 0) {
    if (static_cast<int>(names.size()) < 2 + spares) {
      rpc::refuse(fmt::format("--spares {} leaves no worker for the stages in a world of {}",
                              spares, names.size()));
    }
    names.resize(names.size() - spares);
  }
  // Each replica gets workers of its own (their parameters are averaged between processes).
  const std::size_t available = names.size() == 1 ? 0 : names.size() - 1;
  if (replicas > 1 && available < static_cast<std::size_t>(replicas)) {
    rpc::refuse(fmt::format(
        "--replicas {} needs a worker of its own for each replica at least; the "
        "world has {} besides the master{}",
        replicas, available, spares > 0 ? fmt::format(" and the {} spares", spares) : ""));
  }
  const std::size_t stages = plan.stages.size();
  std::vector<std::string> out;
  for (std::size_t i = 0; i < stages * replicas; ++i) {
    out.push_back(names.size() == 1
                      ? names[0]
                      : names[1 + worker_of_copy(i % stages, i / stages, available,
                                                 static_cast<std::size_t>(replicas))]);
  }
  const std::vector<std::string> stage_names = replica_stage_names(plan, replicas);
  std::stringstream items(placement);
  std::string item;
  while (std::getline(items, item, ',')) {
    auto eq = item.find('=');
    auto it = std::find(stage_names.begin(), stage_names.end(), item.substr(0, eq));
    if (eq == std::string::npos || it == stage_names.end()) {
      rpc::refuse(fmt::format("--placement: \"{}\" is not stage=worker with a stage among {}", item,
                              fmt::join(stage_names, ", ")));
    }
    // "worker2" or "worker2/cuda:0"
    std::string place = item.substr(eq + 1);
    if (std::find(world.begin(), world.end(), worker_of(place)) == world.end()) {
      rpc::refuse(fmt::format("--placement: \"{}\" names no worker of the world ({})", item,
                              fmt::join(world, ", ")));
    }
    out[it - stage_names.begin()] = place;
  }
  return out;
}

std::string TakenOver::describe() const {
  return fmt::format("worker \"{}\" was lost; spare \"{}\" takes over stage {}", lost, spare,
                     fmt::join(stages, ", "));
}

std::vector<TakenOver> take_over_lost_workers(const std::vector<std::string>& stage_names,
                                              std::vector<std::string>& workers,
                                              std::vector<std::string>& spares,
                                              const std::vector<std::string>& lost) {
  // A place is "worker" or "worker/device"; a spare takes the worker's part and keeps the device.
  std::vector<std::string> lost_here;
  for (const std::string& name : lost) {
    if (std::any_of(workers.begin(), workers.end(),
                    [&](const std::string& place) { return worker_of(place) == name; })) {
      lost_here.push_back(name);
    }
  }
  if (lost_here.empty() || lost_here.size() > spares.size()) return {};
  std::vector<TakenOver> done;
  for (const std::string& gone : lost_here) {
    TakenOver taken{gone, spares.front(), {}};
    spares.erase(spares.begin());
    for (size_t k = 0; k < workers.size(); ++k) {
      if (worker_of(workers[k]) != gone) continue;
      workers[k] = taken.spare + workers[k].substr(gone.size());
      taken.stages.push_back(stage_names[k]);
    }
    done.push_back(std::move(taken));
  }
  return done;
}

// What a user needs after a worker is lost, unreachable or out of memory: the stages it holds,
// and where training can resume from. Empty for other errors.
std::string stages_concerned(const rpc::Error& e,
                             const std::vector<const models::RemoteUnet*>& replicas,
                             const std::string& checkpoint_dir) {
  const bool lost = rpc::is_lost(e);
  const bool memory = e.kind() == rpc::ErrorKind::OutOfMemory;
  if (!lost && !memory) return "";
  const std::vector<models::UnetBlock> blocks = models::unet_blocks(replicas.at(0)->depth());
  std::map<std::string, std::vector<std::string>> hosted;
  for (std::size_t r = 0; r < replicas.size(); ++r) {
    for (const models::RemoteUnet::Stage& stage : replicas[r]->stages()) {
      const std::string& from = blocks[stage.plan.first].name;
      const std::string& to = blocks[stage.plan.last - 1].name;
      const std::string name = r == 0 ? stage.name() : fmt::format("{}@{}", stage.name(), r);
      hosted[stage.module.worker()].push_back(
          !memory      ? name
          : from == to ? fmt::format("{} (block {})", name, from)
                       : fmt::format("{} (blocks {}..{})", name, from, to));
    }
  }
  // The error's own worker; for a loss, also every worker this process saw go, since another
  // worker may have reported the loss first.
  std::set<std::string> concerned;
  if (!e.worker().empty()) concerned.insert(e.worker());
  if (lost) {
    for (const std::string& worker : rpc::agent().lost_workers()) concerned.insert(worker);
  }
  std::string out;
  for (const auto& [worker, names] : hosted) {
    if (!concerned.count(worker)) continue;
    out += fmt::format("; worker \"{}\" {} stage {}", worker, lost ? "held" : "holds",
                       fmt::join(names, ", "));
  }
  if (lost && !checkpoint_dir.empty()) {
    out += fmt::format("; the last checkpoint in {} is intact: --resume continues from it",
                       checkpoint_dir);
  }
  return out;
}

}  // namespace ferry::trainer
