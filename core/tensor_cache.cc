#include "ferry/core/tensor_cache.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <malloc.h>
#include <sys/mman.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "ferry/core/environment.h"

namespace ferry::core {
namespace {

constexpr std::size_t kLargeBytes = std::size_t{1} << 20;  // below this, malloc reuses well
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kHugeFrom = std::size_t{8} << 20;  // smaller blocks would waste a page
constexpr std::size_t kGranule = std::size_t{64} << 10;
constexpr std::size_t kDefaultMaxCachedMib = 2048;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Bytes of tensor memory handed out and not yet released, and the most since the last reset.
std::atomic<std::int64_t> live_bytes{0};
std::atomic<std::int64_t> peak_bytes{0};
std::atomic<std::int64_t> budget_bytes{0};  // 0: no bound

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Set while a tensor is allocated for bytes arriving from the wire: failing there would close the
// connection (a bad frame) instead of failing the computation that needs the memory next.
thread_local bool receiving = false;

// Concurrent allocations may each pass the check and together exceed the budget by what they ask
// for: a device's allocator is no stricter about what it will fail.
void check_budget(std::size_t n) {
  if (receiving) return;
  std::int64_t budget = budget_bytes.load(std::memory_order_relaxed);
  if (budget <= 0) return;
  std::int64_t held = live_bytes.load(std::memory_order_relaxed);
  if (held + static_cast<std::int64_t>(n) <= budget) return;
  C10_THROW_ERROR(
      OutOfMemoryError,
      fmt::format("out of memory: a tensor of {:.1f} MiB was asked for while {:.1f} MiB "
                  "are held, {} of {:.0f} MiB",
                  mib(static_cast<std::int64_t>(n)), mib(held), kOverBudget, mib(budget)));
}

std::int64_t budget_from_environment() {
  return whole_number_from_environment("FERRY_MEMORY_BUDGET_MIB", 0, "MiB").value_or(0) << 20;
}

void count(std::int64_t delta) {
  std::int64_t now = live_bytes += delta;
  std::int64_t seen = peak_bytes.load(std::memory_order_relaxed);
  while (now > seen && !peak_bytes.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

std::size_t max_cached_bytes() {
  auto mib = whole_number_from_environment("FERRY_TENSOR_CACHE_MIB", 0, "MiB");
  return static_cast<std::size_t>(mib.value_or(kDefaultMaxCachedMib)) << 20;
}

// LibTorch 2.3 made Allocator::allocate non-const.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define FERRY_ALLOCATE_CONST
#else
#define FERRY_ALLOCATE_CONST const
#endif

// The context of every block is its own address, as LibTorch's raw_allocate() requires. Small
// blocks come from the default allocator's C heap, so malloc_usable_size() gives their size back
// when they are released, without a table.
class TensorCache final : public c10::Allocator {
 public:
  TensorCache() : fallback_(c10::GetDefaultCPUAllocator()), max_cached_(max_cached_bytes()) {}

  c10::DataPtr allocate(std::size_t n) FERRY_ALLOCATE_CONST override {
    check_budget(n);
    if (n < kLargeBytes) {
      c10::DataPtr small = fallback_->allocate(n);
      void* data = small.release_context();
      if (data != nullptr) count(static_cast<std::int64_t>(malloc_usable_size(data)));
      return c10::DataPtr(data, data, &TensorCache::release_small, c10::Device(c10::kCPU));
    }
    std::size_t bytes = n >= kHugeFrom ? round_up(n, kHugePage) : round_up(n, kGranule);
    void* data = take(bytes);
    if (data == nullptr) data = fresh(bytes);
    return c10::DataPtr(data, data, &TensorCache::release, c10::Device(c10::kCPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &TensorCache::release; }

  // LibTorch 2.x asks allocators to copy; 1.13 has no such method, so no `override` here.
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }

  std::size_t cached_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_bytes_;
  }
  std::size_t max_cached() const { return max_cached_; }

 private:
  void* take(std::size_t bytes) const {
    std::lock_guard<std::mutex> lock(mutex_);
    // Accept a cached block up to half again the size needed rather than fault in fresh pages.
    auto it = free_.lower_bound(bytes);
    if (it == free_.end() || it->first > bytes + bytes / 2) return nullptr;
    void* data = it->second;
    count(static_cast<std::int64_t>(it->first));
    cached_bytes_ -= it->first;
    live_.emplace(data, it->first);
    free_.erase(it);
    return data;
  }

  void* fresh(std::size_t bytes) const {
    void* data = nullptr;
    bool huge = bytes >= kHugeFrom;
    if (posix_memalign(&data, huge ? kHugePage : 64, bytes) != 0) throw std::bad_alloc();
    // Advice only: where transparent huge pages are off this fails and nothing changes.
    if (huge) madvise(data, bytes, MADV_HUGEPAGE);
    count(static_cast<std::int64_t>(bytes));
    std::lock_guard<std::mutex> lock(mutex_);
    live_.emplace(data, bytes);
    return data;
  }

  static void release(void* data);
  // A small block, known not to be in the cache's table.
  static void release_small(void* data);

  c10::Allocator* fallback_;
  std::size_t max_cached_;
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, std::size_t> live_;  // blocks in use, by address
  mutable std::multimap<std::size_t, void*> free_;       // blocks for reuse, by size
  mutable std::size_t cached_bytes_ = 0;
};

// Never destroyed: tensors may release their memory during static destruction.
TensorCache& instance() {
  static auto* cache = new TensorCache();
  return *cache;
}

void TensorCache::release_small(void* data) {
  if (data == nullptr) return;
  count(-static_cast<std::int64_t>(malloc_usable_size(data)));
  instance().fallback_->raw_deleter()(data);
}

void TensorCache::release(void* data) {
  if (data == nullptr) return;
  TensorCache& self = instance();
  bool ours = false;
  {
    std::lock_guard<std::mutex> lock(self.mutex_);
    auto it = self.live_.find(data);
    if (it != self.live_.end()) {
      ours = true;
      std::size_t bytes = it->second;
      count(-static_cast<std::int64_t>(bytes));
      self.live_.erase(it);
      if (self.cached_bytes_ + bytes <= self.max_cached_) {
        self.free_.emplace(bytes, data);
        self.cached_bytes_ += bytes;
        return;
      }
    }
  }
  // Over the bound, or a small block handed out raw.
  if (ours) {
    std::free(data);
  } else {
    release_small(data);
  }
}

}  // namespace

void install_tensor_cache() {
  static std::once_flag once;
  std::call_once(once, [] {
    // A budget set in code (a --memory-budget-mib flag) wins over the environment's.
    std::int64_t budget = budget_from_environment();
    if (budget > 0 && budget_bytes.load() == 0) budget_bytes.store(budget);
    // A budget needs the counting allocator even where the cache is off.
    if (instance().max_cached() == 0 && budget_bytes.load() == 0) return;
    c10::SetCPUAllocator(&instance(), /*priority=*/1);
  });
}

void count_tensor_memory() { install_tensor_cache(); }

void set_tensor_memory_budget(std::int64_t bytes) {
  budget_bytes.store(std::max<std::int64_t>(bytes, 0));
}

std::int64_t tensor_memory_budget() { return budget_bytes.load(); }

at::Tensor empty_cached(c10::IntArrayRef shape, c10::ScalarType dtype) {
  receiving = true;
  try {
    at::Tensor t = at::detail::empty_generic(
        shape, &instance(), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype, c10::nullopt);
    receiving = false;
    return t;
  } catch (...) {
    receiving = false;
    throw;
  }
}

std::size_t tensor_cache_bytes() { return instance().cached_bytes(); }

TensorMemory tensor_memory() { return {live_bytes.load(), peak_bytes.load()}; }

void reset_tensor_memory_peak() { peak_bytes.store(live_bytes.load()); }

}  // namespace ferry::core
