// DistributedOptimizer: one LocalOptimizer per parameter owner (dist_autograd/local_optimizer.cc),
// created, stepped and saved through "ferry.optim.*" calls, replicas lined up for averaging.
#include "ferry/dist_autograd/optimizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <map>

#include "ferry/rpc/error.h"
#include "ferry/rpc/fan_out.h"
#include "ferry/rpc/parked.h"
#include "ferry/rpc/rpc.h"

namespace ferry::dist_autograd {

DistributedOptimizer::DistributedOptimizer(OptimizerSpec spec, std::vector<rpc::RRefPtr> params)
    : DistributedOptimizer(std::move(spec),
                           std::vector<std::vector<rpc::RRefPtr>>{std::move(params)}) {}

DistributedOptimizer::DistributedOptimizer(OptimizerSpec spec,
                                           std::vector<std::vector<rpc::RRefPtr>> replicas,
                                           double bucket_mib)
    : spec_(std::move(spec)),
      replica_count_(static_cast<int>(replicas.size())),
      parameter_count_(replicas.empty() ? 0 : replicas[0].size()) {
  if (replicas.empty()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument, "an optimizer needs at least one replica");
  }
  if (!(bucket_mib > 0)) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("the replicas' gradient buckets must hold more than 0 MiB, not {}",
                                 bucket_mib));
  }
  std::map<std::string, int> replica_of_worker;
  for (int r = 0; r < replica_count_; ++r) {
    const std::vector<rpc::RRefPtr>& params = replicas[r];
    if (params.size() != parameter_count_) {
      throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                       fmt::format("replica {} has {} parameters where replica 0 has {}", r,
                                   params.size(), parameter_count_));
    }
    std::map<std::string, size_t> slot;
    const size_t first = owners_.size();
    for (size_t i = 0; i < params.size(); ++i) {
      std::string worker = params[i]->ownerName();
      auto [mine, fresh_worker] = replica_of_worker.try_emplace(worker, r);
      if (mine->second != r) {
        throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                         fmt::format("worker \"{}\" holds parameters of replicas {} and {}: "
                                     "each replica's stages need workers of their own",
                                     worker, mine->second, r));
      }
      auto [it, fresh] = slot.try_emplace(worker, owners_.size());
      if (fresh) owners_.push_back(Owner{worker, r, {}, {}});
      owners_[it->second].indices.push_back(i);
    }
    // Replica r's i-th owner averages with replica 0's i-th: they must hold the same parameters.
    if (r > 0) check_lines_up(first, r);
  }
  c10::Dict<std::string, double> options;
  for (const auto& [key, value] : spec_.options) options.insert(key, value);
  for (Owner& owner : owners_) {
    c10::impl::GenericList refs(c10::AnyType::get());
    for (size_t i : owner.indices) refs.push_back(rpc::to_ivalue(replicas[owner.replica][i]));
    owner.optimizer = rpc::remote(owner.worker, "ferry.optim.create", {spec_.name, options, refs});
  }
  // Every owner builds its optimizer at once; a worker that cannot is named, and a lost one stays
  // lost for the caller.
  rpc::FanOut built;
  for (const Owner& owner : owners_) built.add(owner.optimizer->ready(), owner.worker);
  built.wait(fmt::format("building optimizer \"{}\"", spec_.name));
  if (replica_count_ == 1) return;
  // One group per set of owners that hold the same parameters; all join at once, as they must.
  static std::atomic<std::int64_t> instances{0};
  const std::string prefix =
      fmt::format("ferry/replicas/{}/{}", rpc::self().rank, instances.fetch_add(1));
  const size_t per_replica = owners_.size() / replica_count_;
  on_owners("join the replicas", "ferry.optim.join_replicas", [&](const Owner& owner) {
    const size_t position = (&owner - owners_.data()) % per_replica;
    return std::vector<c10::IValue>{fmt::format("{}/{}/", prefix, position), int64_t{owner.replica},
                                    int64_t{replica_count_},
                                    static_cast<std::int64_t>(bucket_mib * (1 << 20))};
  });
}

std::vector<DistributedOptimizer::BucketStats> DistributedOptimizer::bucket_stats() const {
  std::vector<c10::IValue> per_owner =
      on_owners("bucket_stats", "ferry.optim.replica_stats",
                [](const Owner&) { return std::vector<c10::IValue>{}; });
  std::vector<BucketStats> out;
  for (size_t o = 0; o < owners_.size(); ++o) {
    auto stats = per_owner.at(o).toGenericDict();
    if (stats.empty()) continue;
    auto get = [&](const char* key) { return static_cast<std::int64_t>(stats.at(key).toDouble()); };
    out.push_back(BucketStats{owners_[o].worker, owners_[o].replica, get("buckets"), get("bytes"),
                              get("started_in_backward"), get("started_at_step"),
                              get("late_rounds"), stats.at("waited_s").toDouble()});
  }
  return out;
}

void DistributedOptimizer::check_lines_up(size_t first, int replica) const {
  const size_t per_replica = first / replica;
  auto spread = [](const std::vector<Owner>& owners, size_t from, size_t to) {
    std::vector<std::string> out;
    for (size_t o = from; o < to; ++o) out.push_back(owners[o].worker);
    return fmt::format("{}", fmt::join(out, ", "));
  };
  bool same = owners_.size() - first == per_replica;
  for (size_t o = 0; same && o < per_replica; ++o) {
    same = owners_[first + o].indices == owners_[o].indices;
  }
  if (!same) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("replica {}'s parameters are spread over workers {} unlike "
                                 "replica 0's over {}: every replica must place its stages alike",
                                 replica, spread(owners_, first, owners_.size()),
                                 spread(owners_, 0, per_replica)));
  }
}

std::vector<c10::IValue> DistributedOptimizer::on_owners(
    const std::string& what, const std::string& function,
    const std::function<std::vector<c10::IValue>(const Owner&)>& extra, int replica) const {
  rpc::FanOut calls;
  for (const Owner& owner : owners_) {
    if (replica >= 0 && owner.replica != replica) continue;
    std::vector<c10::IValue> args{rpc::to_ivalue(owner.optimizer)};
    for (auto& arg : extra(owner)) args.push_back(std::move(arg));
    calls.call(owner.worker, function, std::move(args));
  }
  return calls.wait(fmt::format("optimizer \"{}\": {}", spec_.name, what));
}

void DistributedOptimizer::step(std::int64_t context_id) {
  step(std::vector<std::int64_t>{context_id});
}

void DistributedOptimizer::step(const std::vector<std::int64_t>& context_ids) {
  on_contexts("step", "ferry.optim.step", context_ids);
  ++steps_;
}

void DistributedOptimizer::on_contexts(const std::string& what, const std::string& function,
                                       const std::vector<std::int64_t>& context_ids) const {
  if (static_cast<int>(context_ids.size()) != replica_count_) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("optimizer \"{}\": {} given {} autograd contexts for {} "
                                 "replicas (one each)",
                                 spec_.name, what, context_ids.size(), replica_count_));
  }
  on_owners(what, function, [&context_ids](const Owner& owner) {
    return std::vector<c10::IValue>{context_ids[owner.replica]};
  });
}

void DistributedOptimizer::accumulate(std::int64_t context_id) {
  accumulate(std::vector<std::int64_t>{context_id});
}

void DistributedOptimizer::accumulate(const std::vector<std::int64_t>& context_ids) {
  on_contexts("accumulate", "ferry.optim.accumulate", context_ids);
}

void DistributedOptimizer::set_lr(double lr) {
  on_owners("set_lr", "ferry.optim.set_lr",
            [lr](const Owner&) { return std::vector<c10::IValue>{lr}; });
  spec_.options["lr"] = lr;
}

c10::IValue DistributedOptimizer::state_dict() const {
  // Every replica holds the same state: replica 0's is the model's.
  std::vector<c10::IValue> per_owner = on_owners(
      "state_dict", "ferry.optim.state", [](const Owner&) { return std::vector<c10::IValue>{}; },
      /*replica=*/0);
  std::vector<at::Tensor> state(parameter_count_);
  for (size_t o = 0; o < per_owner.size(); ++o) {
    auto tensors = per_owner[o].toTensorVector();
    for (size_t k = 0; k < owners_[o].indices.size(); ++k) {
      state[owners_[o].indices[k]] = tensors.at(k);
    }
  }
  return c10::List<at::Tensor>(state);
}

DistributedOptimizer::TakenState DistributedOptimizer::take_state() const {
  TakenState taken;
  taken.parameter_count = parameter_count_;
  for (const Owner& owner : owners_) {
    if (owner.replica != 0) continue;
    taken.per_owner.push_back(
        rpc::remote(owner.worker, "ferry.optim.take", {rpc::to_ivalue(owner.optimizer)}));
    taken.indices.push_back(owner.indices);
  }
  for (const rpc::RRefPtr& copy : taken.per_owner) {
    try {
      copy->ready()->wait();
    } catch (const std::exception&) {
      rpc::rethrow_as(
          std::current_exception(),
          fmt::format("copying the optimizer's state on worker \"{}\" failed", copy->ownerName()));
    }
  }
  return taken;
}

c10::IValue DistributedOptimizer::TakenState::fetch() const {
  // A few MiB a call to each owner, all owners at once, so that the steps' own calls on their
  // connections go on between the parts.
  constexpr std::int64_t kPartBytes = std::int64_t{8} << 20;
  std::vector<at::Tensor> state(parameter_count);
  std::vector<std::size_t> brought(per_owner.size(), 0);
  std::vector<std::size_t> open;
  for (std::size_t o = 0; o < per_owner.size(); ++o) {
    if (!indices[o].empty()) open.push_back(o);
  }
  while (!open.empty()) {
    rpc::FanOut calls;
    for (std::size_t o : open) {
      calls.call(per_owner[o]->ownerName(), "ferry.optim.taken_part",
                 {rpc::to_ivalue(per_owner[o]), static_cast<std::int64_t>(brought[o]), kPartBytes});
    }
    const std::vector<c10::IValue> parts = calls.wait("bringing the optimizer's state here");
    std::vector<std::size_t> still_open;
    for (std::size_t i = 0; i < open.size(); ++i) {
      const std::size_t o = open[i];
      const std::vector<at::Tensor> tensors = parts[i].toTensorVector();
      if (tensors.empty() || brought[o] + tensors.size() > indices[o].size()) {
        throw rpc::Error(
            rpc::ErrorKind::InvalidArgument,
            fmt::format("worker \"{}\" holds the optimizer state of {} parameters, "
                        "not {}",
                        per_owner[o]->ownerName(), brought[o] + tensors.size(), indices[o].size()));
      }
      for (const at::Tensor& t : tensors) state[indices[o][brought[o]++]] = t;
      if (brought[o] < indices[o].size()) still_open.push_back(o);
    }
    open = std::move(still_open);
  }
  return c10::List<at::Tensor>(state);
}

void DistributedOptimizer::load_state_dict(const c10::IValue& state) {
  if (!state.isTensorList() || state.toTensorList().size() != parameter_count_) {
    throw rpc::Error(
        rpc::ErrorKind::InvalidArgument,
        fmt::format("optimizer state must be a list of {} byte tensors (one per "
                    "parameter) but is {}",
                    parameter_count_,
                    state.isTensorList() ? fmt::format("a list of {}", state.toTensorList().size())
                                         : state.tagKind()));
  }
  std::vector<at::Tensor> all = state.toTensorVector();
  on_owners("load_state_dict", "ferry.optim.load_state", [&all](const Owner& owner) {
    c10::List<at::Tensor> mine;
    for (size_t i : owner.indices) mine.push_back(all[i]);
    return std::vector<c10::IValue>{mine};
  });
}

namespace {

// A parameter's key in a park: its position in the constructor's list.
c10::List<std::string> park_keys(const std::vector<std::size_t>& indices) {
  c10::List<std::string> out;
  for (std::size_t i : indices) out.push_back(std::to_string(i));
  return out;
}

}  // namespace

std::vector<DistributedOptimizer::Parked> DistributedOptimizer::park() const {
  std::vector<OwnerPark> every;
  for (const Owner& owner : owners_) every.push_back({owner.replica, owner.worker, owner.replica});
  return park_owners(every);
}

const DistributedOptimizer::Owner& DistributedOptimizer::owner_on(int replica,
                                                                  const std::string& worker) const {
  for (const Owner& owner : owners_) {
    if (owner.replica == replica && owner.worker == worker) return owner;
  }
  throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                   fmt::format("optimizer \"{}\": worker \"{}\" holds no parameters of replica {}",
                               spec_.name, worker, replica));
}

bool DistributedOptimizer::between_steps(int replica, const std::string& worker) const {
  try {
    const Owner& owner = owner_on(replica, worker);
    return rpc::rpc_sync<std::int64_t>(worker, "ferry.optim.steps_taken",
                                       {rpc::to_ivalue(owner.optimizer)}) == steps_;
  } catch (const rpc::Error&) {
    return false;
  }
}

std::vector<DistributedOptimizer::Parked> DistributedOptimizer::park_owners(
    const std::vector<OwnerPark>& owners) const {
  std::vector<Parked> out;
  for (const OwnerPark& o : owners) {
    const Owner& owner = owner_on(o.replica, o.worker);
    out.push_back(Parked{o.for_replica,
                         rpc::remote(o.worker, "ferry.optim.park",
                                     {rpc::to_ivalue(owner.optimizer), park_keys(owner.indices)})});
  }
  for (const Parked& p : out) {
    try {
      p.state->ready()->wait();
    } catch (const std::exception&) {
      rpc::rethrow_as(std::current_exception(),
                      fmt::format("parking the optimizer's state on worker \"{}\" failed",
                                  p.state->ownerName()));
    }
  }
  return out;
}

void DistributedOptimizer::load_parked(const std::vector<Parked>& parked) {
  on_owners("load_parked", "ferry.optim.load_parked", [&](const Owner& owner) {
    std::vector<rpc::RRefPtr> mine;
    for (const Parked& p : parked) {
      if (p.replica == owner.replica) mine.push_back(p.state);
    }
    return std::vector<c10::IValue>{rpc::parks_value(mine), park_keys(owner.indices)};
  });
}

std::vector<std::string> DistributedOptimizer::owners() const {
  std::vector<std::string> out;
  for (const Owner& owner : owners_) {
    if (owner.replica == 0) out.push_back(owner.worker);
  }
  return out;
}

}  // namespace ferry::dist_autograd
