// The worker's side of DistributedOptimizer: "ferry.optim.*" build a LocalOptimizer (held by an
// RRef on the parameters' owner), step it with a context's gradients, average them over
// replicas (gradient_buckets.h), and save or restore its per-parameter state.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/custom_class.h>
#include <torch/optim.h>
#include <torch/serialize.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "dist_autograd/context_store.h"
#include "dist_autograd/gradient_buckets.h"
#include "dist_autograd/install.h"
#include "dist_autograd/optimizer_factories.h"
#include "dist_autograd/owned_value.h"
#include "ferry/core/compute_thread.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/parked.h"
#include "ferry/rpc/rpc.h"

namespace ferry::dist_autograd {
namespace {

// The optimizer of some parameters on their owner. Steps, saves and loads run one at a time.
struct LocalOptimizer : torch::CustomClassHolder {
  std::mutex mutex;
  std::vector<at::Tensor> params;
  // Gradients of earlier contexts summed for the next step, one per parameter (undefined where
  // none): ours alone, so later ones add in place.
  std::vector<at::Tensor> accumulated;
  // When data parallel: the gradients of the parameters that train, averaged with the same
  // parameters' owners in the other replicas while the backward runs.
  std::shared_ptr<GradientBuckets> buckets;
  OptimizerFactory factory;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  // Steps taken: read without the mutex, so that a master can ask while a step is stuck in an
  // all-reduce with a lost peer.
  std::atomic<std::int64_t> steps{0};
};

// An owner's state as it was at a take: a copy of each parameter's state (null where it had none),
// or, for a type without copy_state, its bytes at once.
struct TakenOptimizer : torch::CustomClassHolder {
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> copies;
  c10::List<at::Tensor> bytes;
};

// An owner's state parked on its worker for the new owners of the same parameters, by key: each
// parameter's state copied as it is, turned into bytes only for a new owner on another worker
// (a new owner here takes the copy itself); bytes at once for a type without copy_state.
struct ParkedOptimizer : torch::CustomClassHolder {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<torch::optim::OptimizerParamState>>
      copies;  // null: no state yet
  std::map<std::string, at::Tensor> bytes;
};

void register_local_optimizer_class() {
  static auto holder = torch::class_<LocalOptimizer>("ferry", "LocalOptimizer");
  static auto taken = torch::class_<TakenOptimizer>("ferry", "TakenOptimizer");
  static auto parked = torch::class_<ParkedOptimizer>("ferry", "ParkedOptimizer");
}

c10::intrusive_ptr<LocalOptimizer> local_of(const c10::IValue& ref) {
  return owned_value(ref, "optimizer").toCustomClass<LocalOptimizer>();
}

// How torch::optim keys a parameter's state: by its TensorImpl's address, written out as text
// in LibTorch 1.x, as the pointer itself in 2.x.
using StateKey = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

template <typename Key>
Key state_key_of(c10::TensorImpl* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << impl;
    return text.str();
  } else {
    return impl;
  }
}

StateKey state_key(const at::Tensor& param) {
  return state_key_of<StateKey>(param.unsafeGetTensorImpl());
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
  std::map<std::string, double> options;
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

// Whether the replicas' buckets hold `param`'s gradients (then they sum them across contexts
// themselves).
bool in_buckets(const LocalOptimizer& local, const at::Tensor& param) {
  return local.buckets && local.buckets->holds(param);
}

void accumulate(const c10::IValue& ref, std::int64_t context_id) {
  auto local = local_of(ref);
  std::lock_guard<std::mutex> lock(local->mutex);
  if (local->buckets) local->buckets->keep(context_id);
  ContextPtr context = find_context(context_id);
  if (!context) return;
  local->accumulated.resize(local->params.size());
  for (std::size_t i = 0; i < local->params.size(); ++i) {
    if (in_buckets(*local, local->params[i])) continue;
    add_to_accumulated(*local, i, context->gradient(local->params[i]));
  }
}

// Parameters that train get the replicas' average, zeros where none had a gradient, so that
// every member reduces the same shapes; frozen ones (requires_grad false) stay out, so the
// optimizer leaves them alone.
void join_replicas(const c10::IValue& ref, const std::string& key, std::int64_t rank,
                   std::int64_t size, std::int64_t bucket_bytes) {
  auto local = local_of(ref);
  const c10::DeviceType device =
      local->params.empty() ? c10::DeviceType::CPU : local->params.front().device().type();
  auto group = std::make_unique<rpc::CollectiveGroup>(
      key, static_cast<int>(rank), static_cast<int>(size),
      rpc::collective_backend_for(device, rpc::nccl_built()));
  std::lock_guard<std::mutex> lock(local->mutex);
  std::vector<at::Tensor> training;
  for (const at::Tensor& p : local->params) {
    if (p.requires_grad()) training.push_back(p);
  }
  local->buckets =
      std::make_shared<GradientBuckets>(std::move(training), std::move(group), bucket_bytes);
  GradientBuckets::attach(local->buckets);
}

void step(const c10::IValue& ref, std::int64_t context_id) {
  auto local = local_of(ref);
  std::lock_guard<std::mutex> lock(local->mutex);
  // A context that never reached this worker has no gradients here: nothing moves.
  ContextPtr context = find_context(context_id);
  for (std::size_t i = 0; i < local->params.size(); ++i) {
    at::Tensor& p = local->params[i];
    if (in_buckets(*local, p)) continue;
    at::Tensor grad = context ? context->gradient(p) : at::Tensor();
    if (local->accumulated.empty()) {
      p.mutable_grad() = grad;
    } else {
      add_to_accumulated(*local, i, grad);
      p.mutable_grad() = local->accumulated[i];
    }
  }
  // Whether the step succeeds or not, what was accumulated went into it.
  local->accumulated.clear();
  auto forget = [&] {
    // The context keeps the gradients; `.grad` stays as the user left it: empty.
    for (at::Tensor& p : local->params) p.mutable_grad() = at::Tensor();
    if (local->buckets) local->buckets->clear_step();
  };
  try {
    if (local->buckets) local->buckets->average_into_grads();
    local->optimizer->step();
    ++local->steps;
  } catch (...) {
    forget();
    throw;
  }
  forget();
}

// One parameter's state as bytes; no bytes where it has none yet.
at::Tensor state_bytes(const torch::optim::OptimizerParamState* state) {
  if (state == nullptr) return at::empty({0}, at::kByte);
  torch::serialize::OutputArchive archive;
  state->serialize(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  return to_bytes(bytes.str());
}

// Each parameter's state, null where it has none yet. Under the optimizer's lock.
std::vector<const torch::optim::OptimizerParamState*> states_of(LocalOptimizer& local) {
  std::vector<const torch::optim::OptimizerParamState*> out;
  auto& states = local.optimizer->state();
  for (const at::Tensor& p : local.params) {
    auto it = states.find(state_key(p));
    out.push_back(it == states.end() ? nullptr : it->second.get());
  }
  return out;
}

c10::List<at::Tensor> save_state(const c10::IValue& ref) {
  auto local = local_of(ref);
  std::lock_guard<std::mutex> lock(local->mutex);
  c10::List<at::Tensor> out;
  for (const auto* state : states_of(*local)) out.push_back(state_bytes(state));
  return out;
}

// Copies the tensors only: turning them into bytes takes far longer, and the step that asked for
// the take waits for it.
c10::intrusive_ptr<TakenOptimizer> take(const c10::IValue& ref) {
  auto local = local_of(ref);
  std::lock_guard<std::mutex> lock(local->mutex);
  auto taken = c10::make_intrusive<TakenOptimizer>();
  for (const auto* state : states_of(*local)) {
    if (!local->factory.copy_state) {
      taken->bytes.push_back(state_bytes(state));
    } else {
      taken->copies.push_back(state ? local->factory.copy_state(*state) : nullptr);
    }
  }
  return taken;
}

// The bytes of parameters `first`, `first` + 1, ... as many as `max_bytes` holds (one at least
// while any remain).
c10::List<at::Tensor> taken_part(const c10::IValue& ref, std::int64_t first,
                                 std::int64_t max_bytes) {
  auto taken = owned_value(ref, "optimizer state taken").toCustomClass<TakenOptimizer>();
  const std::size_t count = taken->copies.empty() ? taken->bytes.size() : taken->copies.size();
  c10::List<at::Tensor> out;
  std::int64_t bytes = 0;
  for (std::size_t i = static_cast<std::size_t>(first); i < count && bytes < max_bytes; ++i) {
    out.push_back(taken->copies.empty() ? taken->bytes.get(i)
                                        : state_bytes(taken->copies[i].get()));
    bytes += out.get(out.size() - 1).numel();
  }
  return out;
}

using StatePtr = std::unique_ptr<torch::optim::OptimizerParamState>;

// A state from its bytes, onto `device` (a state may have been saved from another, or from a copy
// in host memory); null for no bytes (no state yet).
StatePtr state_from_bytes(const LocalOptimizer& local, const at::Tensor& saved,
                          const c10::Device& device) {
  if (saved.numel() == 0) return nullptr;
  at::Tensor bytes = saved.contiguous();
  std::istringstream in(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
  torch::serialize::InputArchive archive;
  archive.load_from(in, device);
  StatePtr state = local.factory.make_state();
  state->serialize(archive);
  return state;
}

// Each parameter's state (null: none) into the optimizer, in place of what it had. Under the
// optimizer's lock.
void install_states(LocalOptimizer& local, std::vector<StatePtr> states) {
  local.accumulated.clear();
  if (local.buckets) local.buckets->clear_step();
  auto& held = local.optimizer->state();
  for (size_t i = 0; i < states.size(); ++i) {
    const auto key = state_key(local.params[i]);
    if (states[i]) {
      held[key] = std::move(states[i]);
    } else {
      held.erase(key);
    }
  }
}

void load_state(const c10::IValue& ref, const std::vector<at::Tensor>& saved) {
  auto local = local_of(ref);
  std::lock_guard<std::mutex> lock(local->mutex);
  if (saved.size() != local->params.size()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("optimizer state for {} parameters given to an optimizer of {}",
                                 saved.size(), local->params.size()));
  }
  std::vector<StatePtr> states;
  for (size_t i = 0; i < saved.size(); ++i) {
    states.push_back(state_from_bytes(*local, saved[i], local->params[i].device()));
  }
  install_states(*local, std::move(states));
}

constexpr const char* kTakeParked = "ferry.optim.take_parked";

c10::intrusive_ptr<ParkedOptimizer> park(const c10::IValue& ref,
                                         const std::vector<std::string>& keys) {
  auto local = local_of(ref);
  std::lock_guard<std::mutex> lock(local->mutex);
  const std::vector<const torch::optim::OptimizerParamState*> states = states_of(*local);
  if (states.size() != keys.size()) {
    throw rpc::Error(
        rpc::ErrorKind::InvalidArgument,
        fmt::format("{} keys to park the state of {} parameters", keys.size(), states.size()));
  }
  auto parked = c10::make_intrusive<ParkedOptimizer>();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (local->factory.copy_state) {
      parked->copies[keys[i]] = states[i] ? local->factory.copy_state(*states[i]) : nullptr;
    } else {
      parked->bytes[keys[i]] = state_bytes(states[i]);
    }
  }
  return parked;
}

c10::intrusive_ptr<ParkedOptimizer> parked_of(const rpc::RRefPtr& park) {
  const c10::IValue value = park->local_value();
  if (!value.isCustomClass()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("park {} on worker \"{}\" holds a {}, not an optimizer's state",
                                 park->id().str(), rpc::self().name, value.tagKind()));
  }
  return value.toCustomClass<ParkedOptimizer>();
}

// What a park holds of `keys`, taken out of it: copies, and bytes.
struct Taken {
  std::map<std::string, StatePtr> copies;
  std::map<std::string, at::Tensor> bytes;
};
Taken take_out(const rpc::RRefPtr& park, const std::vector<std::string>& keys) {
  auto parked = parked_of(park);
  std::lock_guard<std::mutex> lock(parked->mutex);
  Taken out;
  for (const std::string& key : keys) {
    if (auto it = parked->copies.find(key); it != parked->copies.end()) {
      out.copies[key] = std::move(it->second);
      parked->copies.erase(it);
    } else if (auto b = parked->bytes.find(key); b != parked->bytes.end()) {
      out.bytes[key] = b->second;
      parked->bytes.erase(b);
    }
  }
  return out;
}

// For a new owner on another worker: the bytes of what the park holds of `keys`.
c10::Dict<std::string, at::Tensor> take_parked(const rpc::RRefPtr& park,
                                               const std::vector<std::string>& keys) {
  Taken taken = take_out(park, keys);
  c10::Dict<std::string, at::Tensor> out;
  for (auto& [key, copy] : taken.copies) out.insert(key, state_bytes(copy.get()));
  for (auto& [key, bytes] : taken.bytes) out.insert(key, bytes);
  return out;
}

// Each of `keys` (one per parameter, in order) from the first of `parks` that holds it: a copy
// parked here as it is (onto a parameter in host memory), the rest as bytes.
void load_parked(const c10::IValue& ref, const std::vector<rpc::RRefPtr>& parks,
                 const std::vector<std::string>& keys) {
  auto local = local_of(ref);
  if (keys.size() != local->params.size()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("{} keys to load the state of {} parameters", keys.size(),
                                 local->params.size()));
  }
  std::map<std::string, StatePtr> found;
  std::map<std::string, at::Tensor> bytes;
  for (const rpc::RRefPtr& park : parks) {
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (!found.count(key) && !bytes.count(key)) missing.push_back(key);
    }
    if (missing.empty()) break;
    if (park->ownerName() != rpc::self().name) {
      const c10::IValue got = rpc::rpc_sync(
          park->ownerName(), kTakeParked, {rpc::to_ivalue(park), c10::List<std::string>(missing)});
      for (const auto& entry : got.toGenericDict()) {
        bytes[entry.key().toStringRef()] = entry.value().toTensor();
      }
      continue;
    }
    Taken taken = take_out(park, missing);
    for (auto& [key, copy] : taken.copies) found[key] = std::move(copy);
    for (auto& [key, b] : taken.bytes) bytes[key] = b;
  }
  std::vector<StatePtr> states;
  std::vector<std::string> missing;
  for (size_t i = 0; i < keys.size(); ++i) {
    const at::Tensor& p = local->params[i];
    if (auto it = found.find(keys[i]); it != found.end()) {
      // A copy lives in host memory: a parameter elsewhere takes it through its bytes.
      states.push_back(p.is_cpu() || !it->second
                           ? std::move(it->second)
                           : state_from_bytes(*local, state_bytes(it->second.get()), p.device()));
    } else if (auto b = bytes.find(keys[i]); b != bytes.end()) {
      states.push_back(state_from_bytes(*local, b->second, p.device()));
    } else {
      missing.push_back(keys[i]);
    }
  }
  if (!missing.empty()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("the optimizer on worker \"{}\" found the state of parameters "
                                 "{} in none of the {} parks it was given",
                                 rpc::self().name, fmt::join(missing, ", "), parks.size()));
  }
  std::lock_guard<std::mutex> lock(local->mutex);
  install_states(*local, std::move(states));
}

void set_lr(const c10::IValue& ref, double lr) {
  auto local = local_of(ref);
  std::lock_guard<std::mutex> lock(local->mutex);
  for (auto& group : local->optimizer->param_groups()) group.options().set_lr(lr);
}

}  // namespace

void install_optimizer_functions(rpc::FunctionRegistry& registry) {
  register_local_optimizer_class();
  registry.add_raw("ferry.optim.create", create);
  registry.add("ferry.optim.step", [](c10::IValue ref, std::int64_t id) {
    core::run_on_compute_thread([&] { step(ref, id); });
  });
  registry.add("ferry.optim.accumulate", [](c10::IValue ref, std::int64_t id) {
    core::run_on_compute_thread([&] { accumulate(ref, id); });
  });
  registry.add("ferry.optim.join_replicas", [](c10::IValue ref, c10::IValue key, std::int64_t rank,
                                               std::int64_t size, std::int64_t bucket_bytes) {
    join_replicas(ref, key.toStringRef(), rank, size, bucket_bytes);
  });
  registry.add("ferry.optim.replica_stats", [](c10::IValue ref) {
    auto local = local_of(ref);
    std::lock_guard<std::mutex> lock(local->mutex);
    c10::Dict<std::string, double> out;
    if (!local->buckets) return out;
    const GradientBuckets::Stats s = local->buckets->stats();
    out.insert("buckets", static_cast<double>(s.buckets));
    out.insert("bytes", s.bytes);
    out.insert("started_in_backward", s.started_in_backward);
    out.insert("started_at_step", s.started_at_step);
    out.insert("late_rounds", s.late_rounds);
    out.insert("waited_s", s.waited_s);
    return out;
  });
  registry.add("ferry.optim.set_lr", [](c10::IValue ref, double lr) { set_lr(ref, lr); });
  registry.add("ferry.optim.steps_taken",
               [](c10::IValue ref) { return local_of(ref)->steps.load(); });
  registry.add("ferry.optim.state", [](c10::IValue ref) { return save_state(ref); });
  registry.add("ferry.optim.take", [](c10::IValue ref) { return c10::IValue(take(ref)); });
  registry.add("ferry.optim.taken_part",
               [](c10::IValue ref, std::int64_t first, std::int64_t max_bytes) {
                 return taken_part(ref, first, max_bytes);
               });
  registry.add("ferry.optim.load_state",
               [](c10::IValue ref, c10::IValue saved) { load_state(ref, saved.toTensorVector()); });
  registry.add("ferry.optim.park", [](c10::IValue ref, std::vector<std::string> keys) {
    return c10::IValue(park(ref, keys));
  });
  registry.add(kTakeParked, [](rpc::RRefPtr park, std::vector<std::string> keys) {
    return take_parked(park, keys);
  });
  registry.add("ferry.optim.load_parked",
               [](c10::IValue ref, c10::IValue parks, std::vector<std::string> keys) {
                 load_parked(ref, rpc::parks_of(parks), keys);
               });
}

}  // namespace ferry::dist_autograd
