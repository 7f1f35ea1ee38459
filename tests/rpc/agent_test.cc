// Multi-process tests: this process is the master (rank 0), peers are real ferry-test-peer
// processes on 127.0.0.1.
#include "ferry/rpc/agent.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <regex>
#include <thread>

#include "ferry/rpc/rpc.h"
#include "rpc/frame.h"
#include "tests/support/cluster.h"
#include "tests/support/error_of.h"
#include "tests/support/time_scale.h"
#include "tests/support/wait.h"

namespace ferry::rpc {
namespace {

using ferry::testing::kind_and_error_of;
using ferry::testing::worker_of;

using ::testing::HasSubstr;

using ferry::testing::connect_raw;
using ferry::testing::LocalWorld;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

TEST(Agent, EveryAgentListsTheWholeWorld) {
  LocalWorld world;
  const auto& workers = world.master().workers();
  ASSERT_EQ(workers.size(), 3u);
  EXPECT_EQ(workers[0].name, "master");
  EXPECT_EQ(workers[1].name, "a");
  EXPECT_EQ(workers[2].name, "b");
  EXPECT_EQ(world.master().worker("b").rank, 2);
  EXPECT_EQ(workers[1].host, "127.0.0.1");
  try {
    world.master().worker("c");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "no worker is named \"c\" (workers: master, a, b)");
  }
}

TEST(Agent, SyncAndAsyncCallsBothWays) {
  LocalWorld world;
  at::Tensor a = torch::randn({10});
  at::Tensor b = torch::randn({10});
  EXPECT_TRUE(torch::equal(rpc_sync("a", "add", {a, b}).toTensor(), a + b));
  auto future = rpc_async("b", "add", {a, a});
  future->wait();
  EXPECT_TRUE(torch::equal(future->value().toTensor(), a + a));
  EXPECT_EQ(rpc_sync("a", "whoami").toStringRef(), "a");
  EXPECT_NE(rpc_sync("a", "pid").toInt(), ::getpid());
  // Peer "a" calls back into the master.
  c10::IValue back = rpc_sync(
      "a", "relay", {std::string("master"), std::string("echo"), std::string("from a to master")});
  EXPECT_EQ(back.toStringRef(), "from a to master");
}

// A callback that waits for another call's reply: were callbacks run on the loop thread, that
// reply could not be read until the callback returned, and the wait would run out.
TEST(Agent, CallbacksOfAsyncCallsRunOffTheLoop) {
  LocalWorld world;
  std::atomic<int> seen{0};
  std::atomic<bool> second_came_back{false};
  FuturePtr second;
  std::mutex second_mutex;
  auto future = rpc_async("a", "echo", {int64_t{5}});
  auto chained = future->then(
      [&](c10::ivalue::Future& f) {
        seen = static_cast<int>(f.value().toInt());
        FuturePtr call;
        {
          std::lock_guard<std::mutex> lock(second_mutex);
          call = second = rpc_async("b", "echo", {int64_t{7}});
        }
        auto deadline = Clock::now() + std::chrono::seconds(15);
        while (!call->completed() && Clock::now() < deadline) {
          std::this_thread::sleep_for(milliseconds(1));
        }
        second_came_back = call->completed();
        return c10::IValue(f.value().toInt() * 2);
      },
      c10::IntType::get());
  chained->wait();
  EXPECT_EQ(chained->value().toInt(), 10);
  EXPECT_EQ(seen.load(), 5);
  EXPECT_TRUE(second_came_back.load()) << "a reply was not read while a callback ran";
  std::lock_guard<std::mutex> lock(second_mutex);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->value().toInt(), 7);
}

// An inline function is served by the thread that reads the request: it answers while every pool
// thread of its worker is busy and more work is queued behind them.
TEST(Agent, InlineFunctionsAnswerWhileThePoolIsBusy) {
  LocalWorld world;
  // Until a worker knows the whole world it serves every call on the pool (inline ones too, as
  // they may need the world); an answered call says it is past that.
  ASSERT_EQ(rpc_sync("b", "echo", {int64_t{1}}).toInt(), 1);
  std::vector<FuturePtr> sleepers;
  for (int i = 0; i < 6; ++i) sleepers.push_back(rpc_async("b", "sleep_ms", {int64_t{4000}}));
  EXPECT_EQ(rpc_sync("b", "inline_echo", {int64_t{42}}).toInt(), 42);
  int finished = 0;
  for (auto& s : sleepers) finished += s->completed() ? 1 : 0;
  EXPECT_EQ(finished, 0) << "the inline call waited for the pool";
  for (auto& s : sleepers) EXPECT_EQ(kind_and_error_of(s), "no error");
  // Its errors travel as any function's do.
  EXPECT_THAT(kind_and_error_of(rpc_async("b", "inline_echo", {})),
              HasSubstr("RemoteException: call \"inline_echo\" on worker \"b\""));
}

TEST(Agent, ThousandConcurrentAsyncCallsAllComplete) {
  LocalWorld world;
  std::vector<FuturePtr> futures;
  for (int i = 0; i < 1000; ++i) {
    futures.push_back(rpc_async(i % 2 ? "a" : "b", "echo", {int64_t{i}}));
  }
  for (int i = 0; i < 1000; ++i) {
    futures[i]->wait();
    ASSERT_FALSE(futures[i]->hasError()) << futures[i]->tryRetrieveErrorMessage();
    EXPECT_EQ(futures[i]->value().toInt(), i);
  }
}

TEST(Agent, NestedCallGoesThroughASecondPeer) {
  LocalWorld world;
  at::Tensor x = torch::arange(0, 6);
  // master asks a, whose handler asks b.
  c10::IValue direct = rpc_sync("a", "relay", {std::string("b"), std::string("echo"), x});
  EXPECT_TRUE(torch::equal(direct.toTensor(), x));
  c10::IValue async = rpc_sync("a", "relay_async", {std::string("b"), std::string("echo"), x});
  EXPECT_TRUE(torch::equal(async.toTensor(), x));
}

TEST(Agent, NestedAsyncHandlersDoNotExhaustThePool) {
  LocalWorld::Settings settings;
  settings.threads = 1;
  LocalWorld world(settings);
  std::vector<FuturePtr> futures;
  for (int i = 0; i < 50; ++i) {
    futures.push_back(
        rpc_async("a", "relay_async", {std::string("b"), std::string("sleep_ms"), int64_t{20}}));
  }
  for (auto& f : futures) EXPECT_EQ(kind_and_error_of(f), "no error");
}

TEST(Agent, LargeTensorsMakeTheRoundTripIntact) {
  LocalWorld world;
  at::Tensor big = torch::randn({16 << 20});  // 64 MiB
  at::Tensor back = rpc_sync("a", "echo", {big}).toTensor();
  EXPECT_TRUE(torch::equal(back, big));
  at::Tensor slice = big.slice(0, 100, 200);
  EXPECT_TRUE(torch::equal(rpc_sync("b", "echo", {slice}).toTensor(), slice));
}

// Tensors of a frame, and frames, back to back: a read that goes on into tensor memory must stop
// at each tensor's end, leave small tensors to the buffered path and pick up the next frame.
TEST(Agent, FramesOfMixedLargeAndSmallTensorsStreamIntactBackToBack) {
  LocalWorld world;
  std::vector<at::Tensor> parts = {torch::randn({1 << 20}), torch::randn({5000}),
                                   torch::randn({25}), torch::randn({2 << 20}),
                                   torch::randn({4096})};
  c10::List<at::Tensor> list(parts);
  std::vector<FuturePtr> futures;
  for (int i = 0; i < 6; ++i) futures.push_back(rpc_async("a", "echo", {list}));
  for (auto& f : futures) {
    f->wait();
    c10::List<at::Tensor> back = f->value().toTensorList();
    ASSERT_EQ(back.size(), parts.size());
    for (size_t i = 0; i < parts.size(); ++i) EXPECT_TRUE(torch::equal(back[i], parts[i])) << i;
  }
}

TEST(Agent, RemoteExceptionNamesWorkerAndFunction) {
  LocalWorld world;
  std::string error = kind_and_error_of(rpc_async("b", "fail", {std::string("stage exploded")}));
  EXPECT_THAT(error,
              HasSubstr("RemoteException: call \"fail\" on worker \"b\" (rank 2, 127.0.0.1:"))
      << error;
  EXPECT_THAT(error, HasSubstr("raised: stage exploded")) << error;
  EXPECT_EQ(worker_of(rpc_async("b", "fail", {std::string("x")})), "b");
  // Raised on "b" for a call "a" made: the error concerns "b" on every hop back.
  FuturePtr relayed = rpc_async(
      "a", "relay", {std::string("b"), std::string("fail"), std::string("two hops away")});
  EXPECT_EQ(worker_of(relayed), "b");
  EXPECT_THAT(kind_and_error_of(relayed), HasSubstr("two hops away"));
  try {
    rpc_sync("a", "fail", {std::string("sync too")});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::RemoteException);
    EXPECT_THAT(e.what(), HasSubstr("sync too"));
  }
  // The peer keeps serving.
  EXPECT_EQ(rpc_sync("b", "echo", {int64_t{1}}).toInt(), 1);
}

TEST(Agent, UnknownFunctionListsWhatIsRegistered) {
  LocalWorld world;
  std::string error = kind_and_error_of(rpc_async("a", "no_such_function", {}));
  EXPECT_THAT(error, HasSubstr("UnknownFunction: call \"no_such_function\" on worker \"a\""))
      << error;
  EXPECT_THAT(
      error,
      HasSubstr(
          "(registered: add, byte_count, bytes_sent, chain, double_it, echo, fail, fail_backward, "
          "inline_echo, make_remote, owned_rrefs, pid, relay, relay_async, rref_owner, rref_value, "
          "sleep_ms, sleeping, slow_backward, tensor_live_bytes, whoami)"))
      << error;
}

TEST(Agent, BadArgumentsAreNamed) {
  LocalWorld world;
  std::string error =
      kind_and_error_of(rpc_async("a", "add", {torch::ones({1}), std::string("x")}));
  EXPECT_THAT(error, HasSubstr("argument 1 of \"add\" must be Tensor but got str")) << error;
  try {
    rpc_async("nobody", "add", {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("no worker is named \"nobody\""));
  }
}

TEST(Agent, TimeoutReportsTheElapsedTime) {
  LocalWorld world;
  // The call sleeps far longer than its deadline: only the deadline can end it this soon.
  const int64_t sleep_ms = testing::scaled(std::chrono::seconds(60)).count();
  auto start = Clock::now();
  std::string error = kind_and_error_of(rpc_async("a", "sleep_ms", {sleep_ms}, milliseconds(300)));
  auto elapsed = Clock::now() - start;
  EXPECT_THAT(error, HasSubstr("Timeout: call \"sleep_ms\" to worker \"a\"")) << error;
  std::smatch said;
  ASSERT_TRUE(std::regex_search(error, said, std::regex("timed out after ([0-9.]+) s"))) << error;
  EXPECT_GE(std::stod(said[1]), 0.3) << error;
  EXPECT_EQ(worker_of(rpc_async("a", "sleep_ms", {sleep_ms}, milliseconds(100))), "a");
  EXPECT_LT(elapsed, testing::scaled(std::chrono::seconds(30)));
}

TEST(Agent, PeerKilledMidCallFailsPendingFuturesPromptly) {
  LocalWorld::Settings settings;
  settings.shutdown_timeout = milliseconds(2000);
  settings.threads = 8;  // every sleep below runs at once on "b", with a thread left to ask it
  settings.rpc_timeout = testing::scaled(std::chrono::seconds(120));
  LocalWorld world(settings);
  const int64_t sleep_ms = testing::scaled(std::chrono::seconds(60)).count();
  std::vector<FuturePtr> futures;
  for (int i = 0; i < 5; ++i) futures.push_back(rpc_async("b", "sleep_ms", {sleep_ms}));
  // A call "a" makes to "b" on the master's behalf, failing when "b" dies.
  FuturePtr relayed =
      rpc_async("a", "relay", {std::string("b"), std::string("sleep_ms"), c10::IValue(sleep_ms)});
  ASSERT_TRUE(testing::wait_until([] { return rpc_sync("b", "sleeping", {}).toInt() == 6; },
                                  std::chrono::seconds(20)))
      << "the six calls never all reached \"b\"";
  auto killed = Clock::now();
  world.peer(1).kill(SIGKILL);
  for (auto& f : futures) {
    std::string error = kind_and_error_of(f);
    EXPECT_THAT(error, HasSubstr("PeerDied: worker \"b\" (rank 2, 127.0.0.1:")) << error;
    EXPECT_THAT(error, HasSubstr("died during call \"sleep_ms\"")) << error;
    EXPECT_EQ(worker_of(f), "b");
  }
  // The loss reaches the master as "a" saw it: still PeerDied, and about "b", not "a".
  EXPECT_THAT(kind_and_error_of(relayed), HasSubstr("PeerDied: call \"relay\" on worker \"a\""));
  EXPECT_EQ(worker_of(relayed), "b");
  // Long before any call's sleep or deadline could have ended it.
  EXPECT_LT(Clock::now() - killed, testing::scaled(std::chrono::seconds(10)));
  // A new call to the dead peer fails promptly too; the living peer still answers.
  std::string again = kind_and_error_of(rpc_async("b", "echo", {int64_t{1}}));
  EXPECT_THAT(again, HasSubstr("PeerDied")) << again;
  EXPECT_EQ(rpc_sync("a", "echo", {int64_t{2}}).toInt(), 2);
}

TEST(Agent, ShutdownWithADeadPeerIsBounded) {
  LocalWorld::Settings settings;
  settings.shutdown_timeout = milliseconds(3000);
  auto world = std::make_unique<LocalWorld>(settings);
  EXPECT_EQ(rpc_sync("b", "echo", {int64_t{1}}).toInt(), 1);
  world->peer(1).kill(SIGKILL);
  ASSERT_TRUE(world->peer(1).wait(testing::scaled(std::chrono::seconds(10))));
  auto start = Clock::now();
  world.reset();  // graceful shutdown of the master, then of peer "a"
  // Two shutdown bounds one after the other, and room for a loaded machine.
  EXPECT_LT(Clock::now() - start, milliseconds(6000) + testing::scaled(std::chrono::seconds(10)));
  EXPECT_FALSE(is_initialized());
}

// True if the agent closed the connection (read returns 0 or a reset) within the receive timeout.
// Reads past the agent's challenge (its first frame on every connection) to the end of the
// stream, for at most 5 s.
bool closed_by_agent(int fd) {
  timeval limit{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  char buf[256];
  for (int reads = 0; reads < 64; ++reads) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    if (n < 0) return false;
  }
  return false;
}

TEST(Agent, MalformedAndOversizedFramesCloseOnlyThatConnection) {
  LocalWorld world;
  const WorkerInfo& a = world.master().worker("a");
  std::vector<std::string> attacks;
  attacks.push_back(std::string(64, 'x'));  // garbage
  {
    std::string oversized(16, '\0');
    uint32_t magic = kFrameMagic, env = 64;
    uint64_t payload = uint64_t{1} << 40;
    std::memcpy(&oversized[0], &magic, 4);
    std::memcpy(&oversized[4], &env, 4);
    std::memcpy(&oversized[8], &payload, 8);
    attacks.push_back(oversized);
  }
  {
    // A valid request that skips the hello.
    Message m;
    m.kind = MessageKind::Request;
    m.function = "echo";
    m.value = c10::ivalue::Tuple::create({c10::IValue(int64_t{1})});
    EncodedFrame f = encode_frame(m);
    attacks.push_back(std::string(f.head.begin(), f.head.end()));
  }
  {
    std::string garbage_envelope(16, '\0');
    uint32_t magic = kFrameMagic, env = 32;
    uint64_t payload = 0;
    std::memcpy(&garbage_envelope[0], &magic, 4);
    std::memcpy(&garbage_envelope[4], &env, 4);
    std::memcpy(&garbage_envelope[8], &payload, 8);
    attacks.push_back(garbage_envelope + std::string(32, '\x7f'));
  }
  // A healthy connection opened before the attacks stays usable throughout.
  EXPECT_EQ(rpc_sync("a", "echo", {int64_t{0}}).toInt(), 0);
  for (const auto& bytes : attacks) {
    int fd = connect_raw(a);
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    EXPECT_TRUE(closed_by_agent(fd));
    ::close(fd);
    EXPECT_EQ(rpc_sync("a", "echo", {int64_t{7}}).toInt(), 7);
  }
}

}  // namespace
}  // namespace ferry::rpc
