// The table of pending calls on its own, without sockets: each call is taken exactly once, by its
// answer, its deadline, its connection's loss or shutdown; and the lost peers are one record.
#include "rpc/pending_calls.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/support/wait.h"

namespace ferry::rpc {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;
using Clock = PendingCalls::Clock;

PendingCall call_to(int rank, const std::string& function, Clock::time_point deadline,
                    std::uint64_t connection = 0) {
  PendingCall call;
  call.future = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  call.to_rank = rank;
  call.function = function;
  call.start = Clock::now();
  call.deadline = deadline;
  call.connection_id = connection;
  return call;
}

std::vector<std::string> functions(const std::vector<PendingCall>& calls) {
  std::vector<std::string> out;
  for (const PendingCall& c : calls) out.push_back(c.function);
  return out;
}

TEST(PendingCalls, AnAnsweredCallIsTakenOnceAndNoLongerExpires) {
  PendingCalls calls;
  const auto now = Clock::now();
  calls.add(1, call_to(2, "f", now + std::chrono::seconds(1)));
  ASSERT_TRUE(calls.take(1).has_value());
  EXPECT_FALSE(calls.take(1).has_value());
  EXPECT_TRUE(calls.take_expired(now + std::chrono::hours(1)).empty());
  EXPECT_FALSE(calls.assign(1, 7));
  EXPECT_EQ(calls.size(), 0u);
}

TEST(PendingCalls, DeadlinesExpireInOrderUpToNow) {
  PendingCalls calls;
  const auto now = Clock::now();
  calls.add(1, call_to(1, "late", now + std::chrono::seconds(3)));
  calls.add(2, call_to(1, "early", now + std::chrono::seconds(1)));
  calls.add(3, call_to(1, "middle", now + std::chrono::seconds(2)));
  EXPECT_TRUE(calls.take_expired(now).empty());
  EXPECT_THAT(functions(calls.take_expired(now + std::chrono::seconds(2))),
              ElementsAre("early", "middle"));
  EXPECT_EQ(calls.size(), 1u);
  EXPECT_TRUE(calls.take(1).has_value());
}

TEST(PendingCalls, ALostConnectionTakesOnlyTheCallsItCarries) {
  PendingCalls calls;
  const auto later = Clock::now() + std::chrono::seconds(10);
  calls.add(1, call_to(1, "a", later, 5));
  calls.add(2, call_to(1, "b", later));  // queued, no connection yet
  calls.add(3, call_to(2, "c", later, 6));
  ASSERT_TRUE(calls.assign(2, 5));
  EXPECT_THAT(functions(calls.take_on_connection(5)), UnorderedElementsAre("a", "b"));
  EXPECT_TRUE(calls.take_on_connection(5).empty());
  EXPECT_THAT(functions(calls.take_all()), ElementsAre("c"));
  EXPECT_EQ(calls.size(), 0u);
}

TEST(PendingCalls, ShutdownWaitsForTheLastAnswerOrItsDeadline) {
  PendingCalls calls;
  calls.add(1, call_to(1, "f", Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(calls.wait_until_empty(Clock::now() + std::chrono::milliseconds(20)), 1u);
  std::size_t left = 1;
  std::thread shutdown(
      [&] { left = calls.wait_until_empty(Clock::now() + std::chrono::seconds(30)); });
  // The answer comes while shutdown waits, and wakes it long before its deadline.
  const bool waiting = ferry::testing::wait_until([&] { return calls.waiting_until_empty() == 1; },
                                                  std::chrono::seconds(10));
  calls.take(1);
  shutdown.join();
  EXPECT_TRUE(waiting);
  EXPECT_EQ(left, 0u);
}

TEST(PendingCalls, EveryCallIsTakenExactlyOnceWhenThreadsRace) {
  PendingCalls calls;
  const auto now = Clock::now();
  constexpr int kCalls = 2000;
  for (int i = 0; i < kCalls; ++i) {
    calls.add(i, call_to(1, std::to_string(i), now + std::chrono::milliseconds(i % 7), i % 3));
  }
  std::atomic<int> taken{0};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    for (int i = 0; i < kCalls; ++i) taken += calls.take(i).has_value();
  });
  threads.emplace_back([&] { taken += calls.take_expired(now + std::chrono::seconds(1)).size(); });
  threads.emplace_back([&] { taken += calls.take_on_connection(1).size(); });
  threads.emplace_back([&] { taken += calls.take_all().size(); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(taken.load(), kCalls);
  EXPECT_EQ(calls.size(), 0u);
}

TEST(PendingCalls, APeerIsLostOnceWithItsFirstReason) {
  PendingCalls calls;
  EXPECT_FALSE(calls.lost_reason(2).has_value());
  calls.mark_lost(2, "connection reset by peer");
  calls.mark_lost(2, "end of file");
  calls.mark_lost(4, "end of file");
  EXPECT_EQ(calls.lost_reason(2), "connection reset by peer");
  EXPECT_THAT(calls.lost_ranks(), ElementsAre(2, 4));
}

}  // namespace
}  // namespace ferry::rpc
