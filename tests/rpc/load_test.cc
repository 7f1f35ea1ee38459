// Load: many small calls in flight at once complete, and neither side's memory runs away; a
// sender faster than its reader is held back instead of queueing without end.
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "ferry/core/process_memory.h"
#include "ferry/rpc/rpc.h"
#include "tests/support/cluster.h"
#include "tests/support/sanitizer_allowance.h"
#include "tests/support/wait.h"

namespace ferry::rpc {
namespace {

using Clock = std::chrono::steady_clock;

TEST(Load, TenThousandConcurrentSmallCallsCompleteInBoundedMemory) {
  testing::LocalWorld::Settings settings;
  settings.peer_names = {"a"};
  testing::LocalWorld world(settings);
  rpc_sync("a", "echo", {int64_t{0}});  // the connection is up before anything is measured
  double master_before = core::rss_mib();
  double peer_before = core::rss_mib(world.peer(0).pid());
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
  double master_peak = core::peak_rss_mib() - master_before;
  double peer_peak = core::peak_rss_mib(world.peer(0).pid()) - peer_before;
  std::cout << kCalls << " calls in flight at once: " << seconds << " s; peak growth master "
            << master_peak << " MiB, peer " << peer_peak << " MiB\n";
  // 10 000 calls of 64 bytes each: a few KiB of state apiece, not megabytes.
  EXPECT_LT(master_peak, 100.0 + testing::kSanitizerExtraMiB);
  EXPECT_LT(peer_peak, 100.0 + testing::kSanitizerExtraMiB);
  EXPECT_LT(seconds, testing::scaled(std::chrono::seconds(60)).count() / 1000.0);
}

TEST(Load, ASenderOfAGibibyteToAReaderThatStoppedIsHeldBackAtTheQueueBound) {
  testing::LocalWorld::Settings settings;
  settings.peer_names = {"a"};
  settings.rpc_timeout = std::chrono::milliseconds(60000);
  testing::LocalWorld world(settings);
  rpc_sync("a", "echo", {int64_t{0}});
  const std::uint64_t bound = agent().options().max_queued_bytes;
  constexpr int kCalls = 64;
  constexpr int64_t kFloats = 4 << 20;  // 16 MiB a call, 1 GiB in all
  // A stopped process reads nothing: its socket buffers fill, then this side's queue.
  world.peer(0).kill(SIGSTOP);
  core::reset_tensor_memory_peak();
  double rss_before = core::rss_mib();
  std::atomic<int> sent{0};
  std::vector<FuturePtr> calls(kCalls);
  std::thread sender([&] {
    for (int i = 0; i < kCalls; ++i) {
      calls[i] = rpc_async("a", "byte_count", {torch::full({kFloats}, static_cast<float>(i))});
      ++sent;
    }
  });
  // Held back: the count stops moving (a whole look apart) once the queue is full, since the
  // stopped reader takes nothing.
  int last = -1;
  ASSERT_TRUE(testing::wait_until(
      [&] {
        const int now = sent.load();
        const bool still = now > 0 && now == last;
        last = now;
        return still || now == kCalls;
      },
      std::chrono::seconds(60), std::chrono::milliseconds(1500)));
  int sent_while_stopped = sent.load();
  double tensor_peak_mib = core::tensor_memory().peak_bytes / 1048576.0;
  double rss_growth = core::rss_mib() - rss_before;
  world.peer(0).kill(SIGCONT);
  sender.join();
  for (int i = 0; i < kCalls; ++i) {
    calls[i]->wait();
    ASSERT_FALSE(calls[i]->hasError()) << i << ": " << calls[i]->tryRetrieveErrorMessage();
    EXPECT_EQ(calls[i]->value().toInt(), kFloats * 4);
  }
  std::cout << "while the reader was stopped: " << sent_while_stopped << " of " << kCalls
            << " calls of 16 MiB taken, tensor memory peak " << tensor_peak_mib
            << " MiB, RSS growth " << rss_growth << " MiB (queue bound " << (bound >> 20)
            << " MiB)\n";
  EXPECT_LT(sent_while_stopped, kCalls / 2);
  EXPECT_GT(sent_while_stopped, 0);
  // The queue's bound, the tensor being made, and what the socket buffers took.
  EXPECT_LT(tensor_peak_mib, (bound >> 20) + 64.0);
  EXPECT_LT(rss_growth, (bound >> 20) + 128.0);
}

}  // namespace
}  // namespace ferry::rpc
