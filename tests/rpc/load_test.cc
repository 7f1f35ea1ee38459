// Load: many small calls in flight at once complete, and neither side's memory runs away.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <fstream>

#include "ferry/rpc/process_memory.h"
#include "ferry/rpc/rpc.h"
#include "tests/support/cluster.h"

namespace ferry::rpc {
namespace {

using Clock = std::chrono::steady_clock;

// Resident memory now (VmRSS), MiB.
double rss_mib(pid_t pid = 0) {
  std::ifstream status(pid == 0 ? std::string("/proc/self/status")
                                : "/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  }
  return -1;
}

TEST(Load, TenThousandConcurrentSmallCallsCompleteInBoundedMemory) {
  testing::LocalWorld::Settings settings;
  settings.peer_names = {"a"};
  testing::LocalWorld world(settings);
  rpc_sync("a", "echo", {int64_t{0}});  // the connection is up before anything is measured
  double master_before = rss_mib();
  double peer_before = rss_mib(world.peer(0).pid());
  constexpr int kCalls = 10000;
  auto start = Clock::now();
  std::vector<FuturePtr> calls;
  calls.reserve(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(rpc_async("a", "echo", {torch::full({16}, static_cast<float>(i))}));
  }
  for (int i = 0; i < kCalls; ++i) {
    calls[i]->wait();
    ASSERT_FALSE(calls[i]->hasError()) << i;
    ASSERT_EQ(calls[i]->value().toTensor()[0].item<float>(), static_cast<float>(i));
  }
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  double master_peak = peak_rss_mib() - master_before;
  double peer_peak = peak_rss_mib(world.peer(0).pid()) - peer_before;
  std::cout << kCalls << " calls in flight at once: " << seconds << " s; peak growth master "
            << master_peak << " MiB, peer " << peer_peak << " MiB\n";
  // 10 000 calls of 64 bytes each: a few KiB of state apiece, not megabytes.
  EXPECT_LT(master_peak, 100.0);
  EXPECT_LT(peer_peak, 100.0);
  EXPECT_LT(seconds, 30.0);
}

}  // namespace
}  // namespace ferry::rpc
