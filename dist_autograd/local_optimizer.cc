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

void register_local_optimizer_class() {
  static auto holder = torch::class_<LocalOptimizer>("ferry", "LocalOptimizer");
  static auto taken = torch::class_<TakenOptimizer>("ferry", "TakenOptimizer");
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

void load_state(const c10::IValue& ref, const std::vector<at::Tensor>& saved) {
  auto local = local_of(ref);
  std::lock_guard<std::mutex> lock(local->mutex);
  if (saved.size() != local->params.size()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("optimizer state for {} parameters given to an optimizer of {}",
                                 saved.size(), local->params.size()));
  }
  local->accumulated.clear();
  if (local->buckets) local->buckets->clear_step();
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
    // Onto the parameter's device: a state may have been saved from another, or from a copy in
    // host memory.
    archive.load_from(in, p.device());
    auto state = local->factory.make_state();
    state->serialize(archive);
    states[state_key(p)] = std::move(state);
  }
}

constexpr const char* kTakeParked = "ferry.optim.take_parked";

rpc::ParkedTensors park(const c10::IValue& ref, const std::vector<std::string>& keys) {
  c10::List<at::Tensor> state = save_state(ref);
  if (state.size() != keys.size()) {
    throw rpc::Error(
        rpc::ErrorKind::InvalidArgument,
        fmt::format("{} keys to park the state of {} parameters", keys.size(), state.size()));
  }
  rpc::ParkedTensors out;
  for (size_t i = 0; i < keys.size(); ++i) out.insert(keys[i], state.get(i));
  return out;
}

void load_parked(const c10::IValue& ref, const std::vector<rpc::RRefPtr>& parks,
                 const std::vector<std::string>& keys) {
  rpc::ParkedTensors found = rpc::gather_parked(parks, keys, kTakeParked);
  std::vector<at::Tensor> saved;
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (found.contains(key)) {
      saved.push_back(found.at(key));
    } else {
      missing.push_back(key);
    }
  }
  if (!missing.empty()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("the optimizer on worker \"{}\" found the state of parameters "
                                 "{} in none of the {} parks it was given",
                                 rpc::self().name, fmt::join(missing, ", "), parks.size()));
  }
  load_state(ref, saved);
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
  registry.add("ferry.optim.park",
               [](c10::IValue ref, std::vector<std::string> keys) { return park(ref, keys); });
  rpc::install_park_taker(registry, kTakeParked);
  registry.add("ferry.optim.load_parked",
               [](c10::IValue ref, c10::IValue parks, std::vector<std::string> keys) {
                 load_parked(ref, rpc::parks_of(parks), keys);
               });
}

}  // namespace ferry::dist_autograd
