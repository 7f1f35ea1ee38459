// Contexts: the per-process table, the RAII handle a master opens per step, and release, which
// walks the workers a context reached (each forwards to the ones it reached) so that nothing of
// a step is left anywhere once its Context is gone.
#include "ferry/dist_autograd/context.h"

#include <ATen/TensorOperators.h>
#include <fmt/format.h>

#include <atomic>
#include <deque>
#include <unordered_set>

#include "dist_autograd/context_store.h"
#include "dist_autograd/gradient_sink.h"
#include "dist_autograd/install.h"
#include "ferry/core/log.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/fan_out.h"
#include "ferry/rpc/rpc.h"

namespace ferry::dist_autograd {
namespace {

constexpr int kRankShift = 48;
// How many released ids are remembered so that a straggling message cannot revive one.
constexpr std::size_t kReleasedRemembered = 4096;

struct Table {
  std::mutex mutex;
  std::unordered_map<std::int64_t, ContextPtr> contexts;
  std::unordered_set<std::int64_t> released;
  std::deque<std::int64_t> released_order;
};

Table& table() {
  static Table t;
  return t;
}

thread_local std::int64_t current = 0;

// Releases `id` on each of `ranks` except `skip`; the future completes when all have answered.
rpc::FuturePtr release_on(std::int64_t id, const std::set<int>& ranks, int skip) {
  std::vector<rpc::FuturePtr> calls;
  const auto& workers = rpc::workers();
  int self_rank = rpc::self().rank;
  for (int rank : ranks) {
    if (rank == skip || rank == self_rank) continue;
    try {
      calls.push_back(rpc::rpc_async(workers.at(rank).name, "ferry.autograd.release",
                                     {id, static_cast<std::int64_t>(self_rank)}));
    } catch (const std::exception& e) {
      log::warn("autograd context {}: could not release on {}: {}", id, workers.at(rank).name,
                e.what());
    }
  }
  return rpc::when_all(calls)->then(
      [id, calls](c10::ivalue::Future&) {
        for (const auto& call : calls) {
          // A dead worker has nothing left to free; say so and go on.
          if (call->hasError()) {
            log::debug("autograd context {}: release failed: {}", id,
                       call->tryRetrieveErrorMessage());
          }
        }
        return c10::IValue();
      },
      c10::NoneType::get());
}

}  // namespace

void ContextState::add_send(std::int64_t message_id, SendFunction send) {
  std::lock_guard<std::mutex> lock(mutex_);
  sends_.emplace(message_id, std::move(send));
}

std::vector<std::pair<std::int64_t, SendFunction>> ContextState::sends() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {sends_.begin(), sends_.end()};
}

void ContextState::add_roots(const std::vector<torch::autograd::Edge>& roots) {
  std::lock_guard<std::mutex> lock(mutex_);
  roots_.insert(roots_.end(), roots.begin(), roots.end());
}

std::vector<torch::autograd::Edge> ContextState::roots() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return roots_;
}

SendFunction ContextState::send(std::int64_t message_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sends_.find(message_id);
  if (it == sends_.end()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("autograd context {} on worker \"{}\" has no send function {}",
                                 id_, self_name(), message_id));
  }
  return it->second;
}

void ContextState::add_worker(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  workers_.insert(rank);
}

std::set<int> ContextState::workers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return workers_;
}

void ContextState::accumulate(const at::Tensor& variable, const at::Tensor& grad,
                              bool handed_over) {
  if (std::shared_ptr<GradientSink> sink = gradient_sink(variable)) {
    sink->add(id_, variable, grad);
    std::lock_guard<std::mutex> lock(mutex_);
    sunk_.try_emplace(variable.unsafeGetTensorImpl(), variable);
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // An expanded or overlapping gradient cannot be added into in place, even if handed over.
  bool own = handed_over && grad.is_contiguous();
  auto [it, fresh] =
      gradients_.try_emplace(variable.unsafeGetTensorImpl(), Gradient{variable, grad, own});
  if (fresh) return;
  Gradient& g = it->second;
  if (g.own) {
    g.sum.add_(grad);
  } else {
    g.sum = g.sum + grad;
    g.own = true;
  }
}

at::Tensor ContextState::gradient(const at::Tensor& variable) const {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = gradients_.find(variable.unsafeGetTensorImpl());
  if (it != gradients_.end()) return it->second.sum;
  const bool sunk = sunk_.count(variable.unsafeGetTensorImpl()) > 0;
  lock.unlock();
  std::shared_ptr<GradientSink> sink = sunk ? gradient_sink(variable) : nullptr;
  return sink ? sink->gradient(variable) : at::Tensor();
}

std::vector<std::pair<at::Tensor, at::Tensor>> ContextState::gradients() const {
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  std::vector<at::Tensor> sunk;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out.reserve(gradients_.size() + sunk_.size());
    for (const auto& [key, entry] : gradients_) out.emplace_back(entry.variable, entry.sum);
    for (const auto& [key, variable] : sunk_) sunk.push_back(variable);
  }
  for (const at::Tensor& variable : sunk) out.emplace_back(variable, gradient(variable));
  return out;
}

std::int64_t next_id() {
  static std::atomic<std::int64_t> counter{1};
  std::int64_t rank = rpc::is_initialized() ? rpc::self().rank : 0;
  return (rank << kRankShift) | counter.fetch_add(1);
}

ContextPtr create_context() {
  auto context = std::make_shared<ContextState>(next_id());
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.contexts.emplace(context->id(), context);
  return context;
}

ContextPtr join_context(std::int64_t id) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (t.released.count(id)) return nullptr;
  auto [it, fresh] = t.contexts.try_emplace(id);
  if (fresh) it->second = std::make_shared<ContextState>(id);
  return it->second;
}

ContextPtr find_context(std::int64_t id) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.contexts.find(id);
  return it == t.contexts.end() ? nullptr : it->second;
}

ContextPtr context_or_throw(std::int64_t id, const char* what) {
  ContextPtr context = find_context(id);
  if (!context) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("{}: autograd context {} is unknown on worker \"{}\" (never "
                                 "opened here or already released)",
                                 what, id, self_name()));
  }
  return context;
}

ContextPtr erase_context(std::int64_t id) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (t.released.insert(id).second) {
    t.released_order.push_back(id);
    if (t.released_order.size() > kReleasedRemembered) {
      t.released.erase(t.released_order.front());
      t.released_order.pop_front();
    }
  }
  auto it = t.contexts.find(id);
  if (it == t.contexts.end()) return nullptr;
  ContextPtr context = std::move(it->second);
  t.contexts.erase(it);
  return context;
}

std::size_t live_contexts() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.contexts.size();
}

std::string self_name() { return rpc::is_initialized() ? rpc::self().name : "this process"; }

std::int64_t current_id() { return current; }
void set_current_id(std::int64_t id) { current = id; }

Context::Context() {
  if (current != 0) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("this thread already has autograd context {}; a thread holds "
                                 "one context at a time",
                                 current));
  }
  id_ = create_context()->id();
  current = id_;
}

Context::~Context() {
  if (current == id_) current = 0;
  ContextPtr context = erase_context(id_);
  if (!context || !rpc::is_initialized()) return;
  rpc::FuturePtr done = release_on(id_, context->workers(), -1);
  // Bounded: every release call has the RPC deadline.
  done->wait();
}

std::int64_t current_context_id() { return current; }

std::size_t context_count() { return live_contexts(); }

std::int64_t context_count(const std::string& worker) {
  return rpc::rpc_sync(worker, "ferry.autograd.count", {}).toInt();
}

void install(rpc::FunctionRegistry& registry) {
  if (registry.contains("ferry.autograd.release")) return;
  registry.add_async("ferry.autograd.release", [](std::vector<c10::IValue>& args) {
    std::int64_t id = args.at(0).toInt();
    int from = static_cast<int>(args.at(1).toInt());
    ContextPtr context = erase_context(id);
    if (!context) {
      auto done = c10::make_intrusive<c10::ivalue::Future>(c10::NoneType::get());
      done->markCompleted();
      return done;
    }
    return release_on(id, context->workers(), from);
  });
  registry.add("ferry.autograd.count", []() { return static_cast<std::int64_t>(live_contexts()); });
  install_backward_functions(registry);
  install_optimizer_functions(registry);
  rpc::set_grad_observer(make_grad_observer());
}

}  // namespace ferry::dist_autograd
