// DistributedOptimizer and the worker's side of it: "ferry.optim.*" build a LocalOptimizer (held
// by an RRef on the parameters' owner), step it with a context's gradients, and save or restore
// its per-parameter state.
#include "ferry/dist_autograd/optimizer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/custom_class.h>
#include <torch/optim.h>
#include <torch/serialize.h>

#include <atomic>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <sstream>

#include "dist_autograd/context_store.h"
#include "dist_autograd/install.h"
#include "dist_autograd/owned_value.h"
#include "dist_autograd/when_all.h"
#include "ferry/rpc/collective_group.h"
#include "ferry/rpc/compute_thread.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"

namespace ferry::dist_autograd {
namespace {

using Options = std::map<std::string, double>;

// Reads the options a type takes; any other key is an error listing the ones it takes.
class OptionReader {
 public:
  OptionReader(std::string type, const Options& options, std::set<std::string> known)
      : type_(std::move(type)), options_(options), known_(std::move(known)) {
    for (const auto& [key, value] : options_) {
      if (!known_.count(key)) {
        throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                         fmt::format("optimizer \"{}\" has no option \"{}\" (it takes: {})", type_,
                                     key, fmt::join(known_, ", ")));
      }
    }
  }
  double get(const std::string& key, double fallback) const {
    auto it = options_.find(key);
    return it == options_.end() ? fallback : it->second;
  }
  double required(const std::string& key) const {
    auto it = options_.find(key);
    if (it == options_.end()) {
      throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                       fmt::format("optimizer \"{}\" needs option \"{}\"", type_, key));
    }
    return it->second;
  }

 private:
  std::string type_;
  const Options& options_;
  std::set<std::string> known_;
};

template <typename AdamLike, typename AdamLikeOptions, typename State>
OptimizerFactory adam_like(const std::string& type, double default_weight_decay) {
  OptimizerFactory factory;
  factory.make = [type, default_weight_decay](std::vector<at::Tensor> params,
                                              const Options& options) {
    OptionReader o(type, options, {"lr", "beta1", "beta2", "eps", "weight_decay", "amsgrad"});
    AdamLikeOptions defaults(o.required("lr"));
    defaults.betas(std::make_tuple(o.get("beta1", 0.9), o.get("beta2", 0.999)))
        .eps(o.get("eps", 1e-8))
        .weight_decay(o.get("weight_decay", default_weight_decay))
        .amsgrad(o.get("amsgrad", 0) != 0);
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<AdamLike>(std::move(params), defaults));
  };
  factory.make_state = [] {
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::make_unique<State>());
  };
  return factory;
}

struct Factories {
  std::shared_mutex mutex;
  std::map<std::string, OptimizerFactory> by_name;

  Factories() {
    OptimizerFactory sgd;
    sgd.make = [](std::vector<at::Tensor> params, const Options& options) {
      OptionReader o("sgd", options, {"lr", "momentum", "dampening", "weight_decay", "nesterov"});
      torch::optim::SGDOptions defaults(o.required("lr"));
      defaults.momentum(o.get("momentum", 0))
          .dampening(o.get("dampening", 0))
          .weight_decay(o.get("weight_decay", 0))
          .nesterov(o.get("nesterov", 0) != 0);
      return std::unique_ptr<torch::optim::Optimizer>(
          std::make_unique<torch::optim::SGD>(std::move(params), defaults));
    };
    sgd.make_state = [] {
      return std::unique_ptr<torch::optim::OptimizerParamState>(
          std::make_unique<torch::optim::SGDParamState>());
    };
    by_name["sgd"] = sgd;
    by_name["adam"] =
        adam_like<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(
            "adam", 0);
    by_name["adamw"] =
        adam_like<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
            "adamw", 1e-2);
  }
};

Factories& factories() {
  static Factories f;
  return f;
}

OptimizerFactory factory_of(const std::string& name) {
  Factories& f = factories();
  std::shared_lock<std::shared_mutex> lock(f.mutex);
  auto it = f.by_name.find(name);
  if (it == f.by_name.end()) {
    std::vector<std::string> names;
    for (const auto& [known, unused] : f.by_name) names.push_back(known);
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("no optimizer is named \"{}\" on worker \"{}\" (known: {})", name,
                                 rpc::self().name, fmt::join(names, ", ")));
  }
  return it->second;
}

// The optimizer of some parameters on their owner. Steps, saves and loads run one at a time.
struct LocalOptimizer : torch::CustomClassHolder {
  std::mutex mutex;
  std::vector<at::Tensor> params;
  // Gradients of earlier contexts summed for the next step, one per parameter (undefined where
  // none): ours alone, so later ones add in place.
  std::vector<at::Tensor> accumulated;
  // The same parameters' owners in the other replicas, when data parallel: each step averages
  // the gradients over them first.
  std::unique_ptr<rpc::CollectiveGroup> replicas;
  OptimizerFactory factory;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

void register_local_optimizer_class() {
  static auto holder = torch::class_<LocalOptimizer>("ferry", "LocalOptimizer");
}

c10::intrusive_ptr<LocalOptimizer> local_of(const c10::IValue& ref) {
  return owned_value(ref, "optimizer").toCustomClass<LocalOptimizer>();
}

// How torch::optim keys a parameter's state.
std::string state_key(const at::Tensor& param) {
  return c10::guts::to_string(param.unsafeGetTensorImpl());
}

at::Tensor to_bytes(const std::string& s) {
  at::Tensor t = at::empty({static_cast<int64_t>(s.size())}, at::kByte);
  std::memcpy(t.data_ptr(), s.data(), s.size());
  return t;
}

c10::IValue create(std::vector<c10::IValue>& args) {
  register_local_optimizer_class();
  auto local = c10::make_intrusive<LocalOptimizer>();
  local->factory = factory_of(args.at(0).toStringRef());
  Options options;
  for (const auto& entry : args.at(1).toGenericDict()) {
    options[entry.key().toStringRef()] = entry.value().toDouble();
  }
  for (const c10::IValue& ref : args.at(2).toListRef()) {
    local->params.push_back(owned_value(ref, "optimizer parameters").toTensor());
  }
  local->optimizer = local->factory.make(local->params, options);
  return c10::IValue(std::move(local));
}

// Adds `grad` to the sum kept for parameter `i`. The first is copied: a context's gradient may be
// the very tensor that autograd handed to another parameter too.
void add_to_accumulated(LocalOptimizer& local, std::size_t i, const at::Tensor& grad) {
  if (!grad.defined()) return;
  at::Tensor& sum = local.accumulated[i];
  if (sum.defined()) {
    sum.add_(grad);
  } else {
    sum = grad.clone();
  }
}

void accumulate(const c10::IValue& ref, std::int64_t context_id) {
  auto local = local_of(ref);
  std::lock_guard<std::mutex> lock(local->mutex);
  ContextPtr context = find_context(context_id);
  if (!context) return;
  local->accumulated.resize(local->params.size());
  for (std::size_t i = 0; i < local->params.size(); ++i) {
    add_to_accumulated(*local, i, context->gradient(local->params[i]));
  }
}

// Every replica's gradients, averaged, in place of this one's. Parameters that train get a
// gradient of zeros where this replica has none, so that every member reduces the same shapes;
// frozen ones (requires_grad false) stay out, so the optimizer leaves them alone.
void average_over_replicas(LocalOptimizer& local) {
  std::vector<at::Tensor*> slots;
  std::vector<at::Tensor> grads;
  for (at::Tensor& p : local.params) {
    if (!p.requires_grad()) continue;
    slots.push_back(&p.mutable_grad());
    grads.push_back(p.grad().defined() ? p.grad() : at::zeros_like(p));
  }
  local.replicas->average(grads);
  for (size_t i = 0; i < slots.size(); ++i) *slots[i] = grads[i];
}

void join_replicas(const c10::IValue& ref, const std::string& key, std::int64_t rank,
                   std::int64_t size) {
  auto local = local_of(ref);
  auto group =
      std::make_unique<rpc::CollectiveGroup>(key, static_cast<int>(rank), static_cast<int>(size));
  std::lock_guard<std::mutex> lock(local->mutex);
  local->replicas = std::move(group);
}

void step(const c10::IValue& ref, std::int64_t context_id) {
  auto local = local_of(ref);
  std::lock_guard<std::mutex> lock(local->mutex);
  // A context that never reached this worker has no gradients here: nothing moves.
  ContextPtr context = find_context(context_id);
  if (local->accumulated.empty()) {
    for (at::Tensor& p : local->params) {
      p.mutable_grad() = context ? context->gradient(p) : at::Tensor();
    }
  } else {
    for (std::size_t i = 0; i < local->params.size(); ++i) {
      if (context) add_to_accumulated(*local, i, context->gradient(local->params[i]));
      local->params[i].mutable_grad() = local->accumulated[i];
    }
  }
  // Whether the step succeeds or not, what was accumulated went into it.
  local->accumulated.clear();
  try {
    if (local->replicas) average_over_replicas(*local);
    local->optimizer->step();
  } catch (...) {
    for (at::Tensor& p : local->params) p.mutable_grad() = at::Tensor();
    throw;
  }
  // The context keeps the gradients; `.grad` stays as the user left it: empty.
  for (at::Tensor& p : local->params) p.mutable_grad() = at::Tensor();
}

c10::List<at::Tensor> save_state(const c10::IValue& ref) {
  auto local = local_of(ref);
  std::lock_guard<std::mutex> lock(local->mutex);
  c10::List<at::Tensor> out;
  auto& states = local->optimizer->state();
  for (const at::Tensor& p : local->params) {
    auto it = states.find(state_key(p));
    if (it == states.end()) {
      out.push_back(at::empty({0}, at::kByte));
      continue;
    }
    torch::serialize::OutputArchive archive;
    it->second->serialize(archive);
    std::ostringstream bytes;
    archive.save_to(bytes);
    out.push_back(to_bytes(bytes.str()));
  }
  return out;
}

void load_state(const c10::IValue& ref, const std::vector<at::Tensor>& saved) {
  auto local = local_of(ref);
  std::lock_guard<std::mutex> lock(local->mutex);
  if (saved.size() != local->params.size()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("optimizer state for {} parameters given to an optimizer of {}",
                                 saved.size(), local->params.size()));
  }
  local->accumulated.clear();
  auto& states = local->optimizer->state();
  for (size_t i = 0; i < saved.size(); ++i) {
    const at::Tensor& p = local->params[i];
    if (saved[i].numel() == 0) {
      states.erase(state_key(p));
      continue;
    }
    at::Tensor bytes = saved[i].contiguous();
    std::istringstream in(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    auto state = local->factory.make_state();
    state->serialize(archive);
    states[state_key(p)] = std::move(state);
  }
}

void set_lr(const c10::IValue& ref, double lr) {
  auto local = local_of(ref);
  std::lock_guard<std::mutex> lock(local->mutex);
  for (auto& group : local->optimizer->param_groups()) group.options().set_lr(lr);
}

}  // namespace

OptimizerSpec OptimizerSpec::sgd(double lr, double momentum, double weight_decay) {
  return {"sgd", {{"lr", lr}, {"momentum", momentum}, {"weight_decay", weight_decay}}};
}
OptimizerSpec OptimizerSpec::adam(double lr, double weight_decay) {
  return {"adam", {{"lr", lr}, {"weight_decay", weight_decay}}};
}
OptimizerSpec OptimizerSpec::adamw(double lr, double weight_decay) {
  return {"adamw", {{"lr", lr}, {"weight_decay", weight_decay}}};
}

void register_optimizer(const std::string& name, OptimizerFactory factory) {
  Factories& f = factories();
  std::unique_lock<std::shared_mutex> lock(f.mutex);
  f.by_name[name] = std::move(factory);
}

DistributedOptimizer::DistributedOptimizer(OptimizerSpec spec, std::vector<rpc::RRefPtr> params)
    : DistributedOptimizer(std::move(spec),
                           std::vector<std::vector<rpc::RRefPtr>>{std::move(params)}) {}

DistributedOptimizer::DistributedOptimizer(OptimizerSpec spec,
                                           std::vector<std::vector<rpc::RRefPtr>> replicas)
    : spec_(std::move(spec)),
      replica_count_(static_cast<int>(replicas.size())),
      parameter_count_(replicas.empty() ? 0 : replicas[0].size()) {
  if (replicas.empty()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument, "an optimizer needs at least one replica");
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
  std::vector<std::string> failed;
  for (const Owner& owner : owners_) {
    auto ready = owner.optimizer->ready();
    ready->wait();
    if (ready->hasError()) {
      failed.push_back(
          fmt::format("on worker \"{}\": {}", owner.worker, ready->tryRetrieveErrorMessage()));
    }
  }
  if (!failed.empty()) {
    throw rpc::Error(
        rpc::ErrorKind::RemoteException,
        fmt::format("could not build optimizer \"{}\" {}", spec_.name, fmt::join(failed, "; ")));
  }
  if (replica_count_ == 1) return;
  // One group per set of owners that hold the same parameters; all join at once, as they must.
  static std::atomic<std::int64_t> instances{0};
  const std::string prefix =
      fmt::format("ferry/replicas/{}/{}", rpc::self().rank, instances.fetch_add(1));
  const size_t per_replica = owners_.size() / replica_count_;
  on_owners("join the replicas", "ferry.optim.join_replicas", [&](const Owner& owner) {
    const size_t position = (&owner - owners_.data()) % per_replica;
    return std::vector<c10::IValue>{fmt::format("{}/{}/", prefix, position), int64_t{owner.replica},
                                    int64_t{replica_count_}};
  });
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
  std::vector<FuturePtr> calls;
  std::vector<const Owner*> called;
  for (const Owner& owner : owners_) {
    if (replica >= 0 && owner.replica != replica) continue;
    called.push_back(&owner);
    std::vector<c10::IValue> args{rpc::to_ivalue(owner.optimizer)};
    for (auto& arg : extra(owner)) args.push_back(std::move(arg));
    calls.push_back(rpc::rpc_async(owner.worker, function, std::move(args)));
  }
  when_all(calls)->wait();
  std::vector<std::string> failed;
  std::vector<c10::IValue> results;
  // A worker that died (PeerDied) or went silent (Timeout) stays so for the caller, which may put
  // a spare in its place, even when another worker failed first because of it (its replicas'
  // all-reduce); otherwise the first failure's kind.
  rpc::ErrorKind kind = rpc::ErrorKind::RemoteException;
  auto lost = [](rpc::ErrorKind k) {
    return k == rpc::ErrorKind::PeerDied || k == rpc::ErrorKind::Timeout;
  };
  for (size_t i = 0; i < calls.size(); ++i) {
    if (!calls[i]->hasError()) {
      results.push_back(calls[i]->value());
      continue;
    }
    std::string cause = calls[i]->tryRetrieveErrorMessage();
    try {
      std::rethrow_exception(calls[i]->exception_ptr());
    } catch (const rpc::Error& e) {
      if (!e.cause().empty()) cause = e.cause();
      if (failed.empty() || (lost(e.kind()) && !lost(kind))) kind = e.kind();
    } catch (...) {
    }
    failed.push_back(fmt::format("on worker \"{}\": {}", called[i]->worker, cause));
  }
  if (!failed.empty()) {
    throw rpc::Error(kind, fmt::format("optimizer \"{}\": {} failed {}", spec_.name, what,
                                       fmt::join(failed, "; ")));
  }
  return results;
}

void DistributedOptimizer::step(std::int64_t context_id) {
  step(std::vector<std::int64_t>{context_id});
}

void DistributedOptimizer::step(const std::vector<std::int64_t>& context_ids) {
  on_contexts("step", "ferry.optim.step", context_ids);
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

std::vector<std::string> DistributedOptimizer::owners() const {
  std::vector<std::string> out;
  for (const Owner& owner : owners_) {
    if (owner.replica == 0) out.push_back(owner.worker);
  }
  return out;
}

void install_optimizer_functions(rpc::FunctionRegistry& registry) {
  register_local_optimizer_class();
  registry.add_raw("ferry.optim.create", create);
  registry.add("ferry.optim.step", [](c10::IValue ref, std::int64_t id) {
    rpc::run_on_compute_thread([&] { step(ref, id); });
  });
  registry.add("ferry.optim.accumulate", [](c10::IValue ref, std::int64_t id) {
    rpc::run_on_compute_thread([&] { accumulate(ref, id); });
  });
  registry.add("ferry.optim.join_replicas",
               [](c10::IValue ref, c10::IValue key, std::int64_t rank, std::int64_t size) {
                 join_replicas(ref, key.toStringRef(), rank, size);
               });
  registry.add("ferry.optim.set_lr", [](c10::IValue ref, double lr) { set_lr(ref, lr); });
  registry.add("ferry.optim.state", [](c10::IValue ref) { return save_state(ref); });
  registry.add("ferry.optim.load_state",
               [](c10::IValue ref, c10::IValue saved) { load_state(ref, saved.toTensorVector()); });
}

}  // namespace ferry::dist_autograd
