// A connection's sending half on its own, before it has a socket: what it queues, when it asks
// the loop thread to flush, and how its bound holds senders back. (Direct writes and a closing
// connection need the loop thread; the agent tests cover them.)
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "rpc/connection.h"

namespace ferry::rpc {
namespace {

using Clock = SocketWriter::Clock;

EncodedFrame frame_of(std::size_t bytes) {
  EncodedFrame frame;
  frame.head.assign(bytes, 'x');
  return frame;
}

struct Wakes {
  std::atomic<int> count{0};
  std::atomic<std::uint64_t> last_id{0};
  std::function<void(std::uint64_t)> callback() {
    return [this](std::uint64_t id) {
      last_id = id;
      ++count;
    };
  }
};

TEST(SocketWriter, BeforeItsSocketConnectsFramesQueueAndTheLoopIsAskedOnce) {
  Wakes wakes;
  SocketWriter writer(7, 1 << 20, wakes.callback());
  for (int i = 0; i < 3; ++i) {
    EncodedFrame frame = frame_of(100);
    EXPECT_EQ(writer.send(frame, SocketWriter::kNoBound), SocketWriter::Result::Queued);
  }
  EXPECT_EQ(writer.queued_bytes(), 300u);
  // The first frame asked the loop to flush; the ones behind it go with it.
  EXPECT_EQ(wakes.count.load(), 1);
  EXPECT_EQ(wakes.last_id.load(), 7u);
}

TEST(SocketWriter, ASenderPastTheBoundGivesUpAtItsDeadline) {
  Wakes wakes;
  SocketWriter writer(1, 1000, wakes.callback());
  EncodedFrame first = frame_of(800);
  ASSERT_EQ(writer.send(first, Clock::now() + std::chrono::seconds(5)),
            SocketWriter::Result::Queued);
  EncodedFrame second = frame_of(800);
  Clock::time_point start = Clock::now();
  EXPECT_EQ(writer.send(second, start + std::chrono::milliseconds(50)), SocketWriter::Result::Full);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(50));
  EXPECT_EQ(second.size(), 800u);  // not taken: the caller still holds it
  EXPECT_EQ(writer.queued_bytes(), 800u);
}

TEST(SocketWriter, UnboundedSendsAndAFirstFrameAreTakenWhateverTheirSize) {
  Wakes wakes;
  SocketWriter writer(1, 1000, wakes.callback());
  // Larger than the bound, into an empty queue: waiting could never make room for it.
  EncodedFrame big = frame_of(5000);
  EXPECT_EQ(writer.send(big, Clock::now() + std::chrono::seconds(5)), SocketWriter::Result::Queued);
  // Unbounded, as the loop thread sends: taken although the queue is over its bound.
  EncodedFrame more = frame_of(5000);
  EXPECT_EQ(writer.send(more, SocketWriter::kNoBound), SocketWriter::Result::Queued);
  EXPECT_EQ(writer.queued_bytes(), 10000u);
}

TEST(SocketWriter, FramesFromManyThreadsAreEachQueuedOnce) {
  Wakes wakes;
  SocketWriter writer(1, 1u << 30, wakes.callback());
  std::vector<std::thread> senders;
  for (int t = 0; t < 4; ++t) {
    senders.emplace_back([&writer] {
      for (int i = 0; i < 250; ++i) {
        EncodedFrame frame = frame_of(10);
        writer.send(frame, Clock::now() + std::chrono::seconds(30));
      }
    });
  }
  for (std::thread& t : senders) t.join();
  EXPECT_EQ(writer.queued_bytes(), 10000u);
  EXPECT_EQ(wakes.count.load(), 1);
}

}  // namespace
}  // namespace ferry::rpc
