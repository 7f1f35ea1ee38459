#include "rpc/receive_allocator.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace ferry::rpc {
namespace {

TEST(ReceiveAllocator, LargeBuffersAreReusedInsteadOfFaultedInAgain) {
  void* first = nullptr;
  {
    at::Tensor t = empty_for_receive({3 << 20}, at::kFloat);  // 12 MiB
    first = t.data_ptr();
    t.fill_(1.0f);
  }
  EXPECT_GE(receive_cache_bytes(), std::size_t{12} << 20);
  at::Tensor again = empty_for_receive({3 << 20}, at::kFloat);
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(again.numel(), 3 << 20);
}

TEST(ReceiveAllocator, TensorsBehaveAsOrdinaryTensors) {
  at::Tensor t = empty_for_receive({1024, 1024}, at::kDouble);
  t.fill_(2.0);
  EXPECT_EQ(t.sum().item<double>(), 2.0 * 1024 * 1024);
  t.resize_({4096, 1024});  // grows through the same allocator
  t.fill_(1.0);
  EXPECT_EQ(t.sum().item<double>(), 4096.0 * 1024);
  at::Tensor small = empty_for_receive({3}, at::kInt);
  EXPECT_EQ(small.numel(), 3);
}

}  // namespace
}  // namespace ferry::rpc
