#include "rpc/receive_allocator.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <cstdlib>
#include <map>
#include <mutex>

namespace ferry::rpc {
namespace {

constexpr std::size_t kLargeBytes = std::size_t{1} << 20;  // below this, malloc reuses well
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kMaxCachedBytes = std::size_t{512} << 20;

struct Block {
  void* data;
  std::size_t bytes;
};

class ReceiveAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(std::size_t n) const override {
    if (n < kLargeBytes) return c10::GetCPUAllocator()->allocate(n);
    std::size_t bytes = (n + kHugePage - 1) / kHugePage * kHugePage;
    Block* block = take(bytes);
    if (block == nullptr) block = fresh(bytes);
    return c10::DataPtr(block->data, block, &ReceiveAllocator::release, c10::Device(c10::kCPU));
  }

  // LibTorch 2.x asks allocators to copy; 1.13 has no such method, so no `override` here.
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }

  std::size_t cached_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_bytes_;
  }

 private:
  Block* take(std::size_t bytes) const {
    std::lock_guard<std::mutex> lock(mutex_);
    // Accept a cached block up to twice the size needed rather than fault in fresh pages.
    auto it = free_.lower_bound(bytes);
    if (it == free_.end() || it->first > 2 * bytes) return nullptr;
    Block* block = it->second;
    free_.erase(it);
    cached_bytes_ -= block->bytes;
    return block;
  }

  static Block* fresh(std::size_t bytes) {
    void* data = nullptr;
    if (posix_memalign(&data, kHugePage, bytes) != 0) throw std::bad_alloc();
    // Advice only: where transparent huge pages are off this fails and nothing changes.
    madvise(data, bytes, MADV_HUGEPAGE);
    return new Block{data, bytes};
  }

  static void release(void* context);

  mutable std::mutex mutex_;
  mutable std::multimap<std::size_t, Block*> free_;
  mutable std::size_t cached_bytes_ = 0;
};

// Never destroyed: tensors may release their memory during static destruction.
ReceiveAllocator& instance() {
  static auto* allocator = new ReceiveAllocator();
  return *allocator;
}

void ReceiveAllocator::release(void* context) {
  auto* block = static_cast<Block*>(context);
  ReceiveAllocator& self = instance();
  {
    std::lock_guard<std::mutex> lock(self.mutex_);
    if (self.cached_bytes_ + block->bytes <= kMaxCachedBytes) {
      self.free_.emplace(block->bytes, block);
      self.cached_bytes_ += block->bytes;
      return;
    }
  }
  std::free(block->data);
  delete block;
}

}  // namespace

at::Tensor empty_for_receive(c10::IntArrayRef shape, c10::ScalarType dtype) {
  return at::detail::empty_generic(shape, &instance(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   dtype, c10::nullopt);
}

std::size_t receive_cache_bytes() { return instance().cached_bytes(); }

}  // namespace ferry::rpc
