#include "ferry/core/compute_thread.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tests/support/wait.h"

namespace ferry::core {
namespace {

using ferry::testing::wait_until;
using ::testing::HasSubstr;

std::thread::id compute_thread_id() {
  return on_compute_thread([] { return std::this_thread::get_id(); });
}

TEST(ComputeThread, EveryCallerGetsTheSameThreadWhichIsNoneOfTheirs) {
  std::thread::id compute = compute_thread_id();
  EXPECT_NE(compute, std::this_thread::get_id());
  std::vector<std::thread::id> seen(4);
  std::vector<std::thread> callers;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    callers.emplace_back([&seen, i] { seen[i] = compute_thread_id(); });
  }
  for (std::thread& t : callers) t.join();
  for (std::thread::id id : seen) EXPECT_EQ(id, compute);
}

TEST(ComputeThread, RethrowsWhatTheWorkThrewWithItsTypeAndMessage) {
  try {
    run_on_compute_thread([] { throw std::invalid_argument("stage 2 has no input"); });
    FAIL() << "nothing was thrown";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("stage 2 has no input"));
  }
  // The thread survives a throwing task.
  EXPECT_EQ(on_compute_thread([] { return 42; }), 42);
}

TEST(ComputeThread, WorkOnTheComputeThreadThatAsksForItRunsAtOnce) {
  // Queued behind itself, the inner call would wait forever.
  int inner = on_compute_thread([] { return on_compute_thread([] { return 7; }); });
  EXPECT_EQ(inner, 7);
}

TEST(ComputeThread, ReturnsMoveOnlyResults) {
  std::unique_ptr<int> value = on_compute_thread([] { return std::make_unique<int>(5); });
  ASSERT_NE(value, nullptr);
  EXPECT_EQ(*value, 5);
}

TEST(ComputeThread, WorkSeesTheCallersGradMode) {
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(on_compute_thread([] { return torch::GradMode::is_enabled(); }));
  }
  EXPECT_TRUE(on_compute_thread([] { return torch::GradMode::is_enabled(); }));
}

TEST(ComputeThread, PostedWorkRunsInTheOrderItWasPosted) {
  std::mutex mutex;
  std::vector<int> order;
  for (int i = 0; i < 50; ++i) {
    post_to_compute_thread([&mutex, &order, i] {
      std::lock_guard<std::mutex> lock(mutex);
      order.push_back(i);
    });
  }
  // Queued behind the posts, so they have all run when it returns.
  run_on_compute_thread([] {});
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

TEST(ComputeThread, PostReturnsBeforeTheWorkRuns) {
  std::atomic<bool> release{false};
  std::atomic<bool> ran{false};
  post_to_compute_thread([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ran = true;
  });
  EXPECT_FALSE(ran.load());
  release = true;
  EXPECT_TRUE(wait_until([&] { return ran.load(); }, std::chrono::seconds(30)));
}

// A layer's per-thread state, as rpc's autograd context is: 0 where nothing was entered.
thread_local int carried_tag = 0;

TEST(ComputeThread, TheCarrierTakesTheCallersStateOverAndLeavesItAfterward) {
  static std::once_flag added;
  std::call_once(added, [] {
    carry_to_compute_thread([]() -> EnterCaptured {
      int tag = carried_tag;
      if (tag == 0) return nullptr;
      return [tag]() -> std::shared_ptr<void> {
        int previous = carried_tag;
        carried_tag = tag;
        return std::shared_ptr<void>(nullptr, [previous](void*) { carried_tag = previous; });
      };
    });
  });
  carried_tag = 7;
  EXPECT_EQ(on_compute_thread([] { return carried_tag; }), 7);
  int posted = -1;
  post_to_compute_thread([&posted] { posted = carried_tag; });
  carried_tag = 9;
  EXPECT_EQ(on_compute_thread([] { return carried_tag; }), 9);
  EXPECT_EQ(posted, 7);  // captured when posted, not when run
  carried_tag = 0;
  // Nothing captured: the compute thread's own state, which the guards restored.
  EXPECT_EQ(on_compute_thread([] { return carried_tag; }), 0);
}

// 0 if stopping waited for the work that runs, dropped the work queued behind it, and refused the
// next caller instead of leaving it waiting for ever.
int stop_while_busy() {
  std::atomic<bool> started{false};
  std::atomic<bool> finished{false};
  std::atomic<bool> queued_ran{false};
  post_to_compute_thread([&] {
    started = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    finished = true;
  });
  post_to_compute_thread([&] { queued_ran = true; });
  const bool began = wait_until([&] { return started.load(); }, std::chrono::seconds(30));
  const bool idle = stop_compute_thread(std::chrono::seconds(30));
  bool refused = false;
  try {
    run_on_compute_thread([] {});
  } catch (const std::future_error&) {
    refused = true;
  }
  return began && idle && finished && !queued_ran && refused ? 0 : 1;
}

// In a process of its own, since a stopped compute thread stays stopped.
TEST(ComputeThreadDeathTest, StoppingWaitsForTheRunningWorkAndDropsTheQueued) {
  // A fresh process: a forked one would not have the compute thread that earlier tests started.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(stop_while_busy()), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace ferry::core
