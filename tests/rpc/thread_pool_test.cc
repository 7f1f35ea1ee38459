#include "rpc/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tests/support/wait.h"

namespace ferry::rpc {
namespace {

using ferry::testing::wait_until;

TEST(ThreadPool, RunsEveryTaskOnItsOwnThreadsOnly) {
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::atomic<int> ran{0};
  {
    ThreadPool pool(3);
    for (int i = 0; i < 200; ++i) {
      pool.submit([&] {
        {
          std::lock_guard<std::mutex> lock(mutex);
          threads.insert(std::this_thread::get_id());
        }
        ++ran;
      });
    }
  }
  EXPECT_EQ(ran.load(), 200);
  EXPECT_LE(threads.size(), 3u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

TEST(ThreadPool, TheDestructorRunsWhatIsQueuedBeforeJoining) {
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  {
    ThreadPool pool(1);
    pool.submit([&] {
      while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    for (int i = 0; i < 20; ++i) pool.submit([&] { ++ran; });
    EXPECT_EQ(ran.load(), 0);  // all queued behind the first
    release = true;
  }
  EXPECT_EQ(ran.load(), 20);
}

TEST(ThreadPool, OneThreadRunsTasksInTheOrderOfSubmission) {
  std::vector<int> order;
  {
    ThreadPool pool(1);
    for (int i = 0; i < 100; ++i) pool.submit([&order, i] { order.push_back(i); });
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(ThreadPool, TasksRunAtTheSameTimeOnDifferentThreads) {
  // Each of the two waits for the other to start: they finish only if they run side by side.
  std::atomic<int> started{0};
  std::atomic<int> met{0};
  ThreadPool pool(2);
  for (int i = 0; i < 2; ++i) {
    pool.submit([&] {
      ++started;
      if (wait_until([&] { return started.load() == 2; }, std::chrono::seconds(30),
                     std::chrono::milliseconds(1))) {
        ++met;
      }
    });
  }
  EXPECT_TRUE(wait_until([&] { return met.load() == 2; }, std::chrono::seconds(60)));
}

TEST(ThreadPool, ATaskMaySubmitAnotherAndOneThatThrowsLeavesThePoolServing) {
  std::atomic<bool> inner_ran{false};
  ThreadPool pool(1);
  pool.submit([] { throw std::runtime_error("a handler's failure"); });
  pool.submit([&] { pool.submit([&] { inner_ran = true; }); });
  EXPECT_TRUE(wait_until([&] { return inner_ran.load(); }, std::chrono::seconds(30)));
}

}  // namespace
}  // namespace ferry::rpc
