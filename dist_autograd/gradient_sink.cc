#include "dist_autograd/gradient_sink.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace ferry::dist_autograd {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<const void*, std::weak_ptr<GradientSink>> sinks;
  std::atomic<std::size_t> size{0};
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void attach_gradient_sink(const std::vector<at::Tensor>& variables,
                          const std::shared_ptr<GradientSink>& sink) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const at::Tensor& v : variables) r.sinks[v.unsafeGetTensorImpl()] = sink;
  r.size = r.sinks.size();
}

void detach_gradient_sink(const GradientSink* sink) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto it = r.sinks.begin(); it != r.sinks.end();) {
    auto held = it->second.lock();
    // An expired entry's sink is being destroyed: it is the one detaching, or one that will.
    if (!held || held.get() == sink) {
      it = r.sinks.erase(it);
    } else {
      ++it;
    }
  }
  r.size = r.sinks.size();
}

std::shared_ptr<GradientSink> gradient_sink(const at::Tensor& variable) {
  Registry& r = registry();
  if (r.size == 0) return nullptr;
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.sinks.find(variable.unsafeGetTensorImpl());
  return it == r.sinks.end() ? nullptr : it->second.lock();
}

bool has_gradient_sinks() { return registry().size > 0; }

}  // namespace ferry::dist_autograd
