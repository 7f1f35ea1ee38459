#include "ferry/core/tensor_cache.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace ferry::core {
namespace {

TEST(TensorCache, LargeBuffersAreReusedInsteadOfFaultedInAgain) {
  void* first = nullptr;
  {
    at::Tensor t = empty_cached({3 << 20}, at::kFloat);  // 12 MiB
    first = t.data_ptr();
    t.fill_(1.0f);
  }
  std::size_t held = tensor_cache_bytes();
  EXPECT_GE(held, std::size_t{12} << 20);
  at::Tensor again = empty_cached({3 << 20}, at::kFloat);
  // The cache's own count: the block left it. Equal addresses alone could come from malloc too.
  EXPECT_LE(tensor_cache_bytes(), held - (std::size_t{12} << 20));
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(again.numel(), 3 << 20);
}

TEST(TensorCache, TensorsBehaveAsOrdinaryTensors) {
  at::Tensor t = empty_cached({1024, 1024}, at::kDouble);
  t.fill_(2.0);
  EXPECT_EQ(t.sum().item<double>(), 2.0 * 1024 * 1024);
  t.resize_({4096, 1024});  // grows through the same allocator
  t.fill_(1.0);
  EXPECT_EQ(t.sum().item<double>(), 4096.0 * 1024);
  at::Tensor small = empty_cached({3}, at::kInt);
  EXPECT_EQ(small.numel(), 3);
}

TEST(TensorCache, InstalledItServesEveryLargeCpuTensor) {
  install_tensor_cache();
  void* first = nullptr;
  {
    at::Tensor t = torch::ones({5 << 20}, at::kFloat);  // 20 MiB, made by an ordinary op
    first = t.data_ptr();
  }
  std::size_t held = tensor_cache_bytes();
  EXPECT_GE(held, std::size_t{20} << 20);
  at::Tensor again = torch::zeros({5 << 20}, at::kFloat);
  EXPECT_LE(tensor_cache_bytes(), held - (std::size_t{20} << 20));
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(again.sum().item<float>(), 0.0f);
}

}  // namespace
}  // namespace ferry::core
