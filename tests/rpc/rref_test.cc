// RRefs across real processes: this process is the master, peers "a", "b", "c" own values.
#include "ferry/rpc/rref.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include "ferry/rpc/rpc.h"
#include "tests/support/cluster.h"
#include "tests/support/error_of.h"
#include "tests/support/wait.h"

namespace ferry::rpc {
namespace {

using ferry::testing::kind_and_error_of;
using ::testing::HasSubstr;

using ferry::testing::LocalWorld;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

LocalWorld::Settings three_peers() {
  LocalWorld::Settings settings;
  settings.peer_names = {"a", "b", "c"};
  return settings;
}

// Polls `owner`'s count of owned values until it equals `expected` (bounded).
int64_t owned_on(const std::string& owner, int64_t expected) {
  int64_t count = -1;
  ferry::testing::wait_until(
      [&] { return (count = rpc_sync(owner, "owned_rrefs").toInt()) == expected; },
      std::chrono::seconds(5));
  return count;
}

TEST(RRef, RemoteKeepsTheValueOnItsOwnerAndToHereFetchesIt) {
  LocalWorld world(three_peers());
  at::Tensor x = torch::randn({4, 4});
  RRefPtr rref = remote("a", "add", {x, x});
  EXPECT_FALSE(rref->isOwner());
  EXPECT_EQ(rref->owner(), 1);
  EXPECT_EQ(rref->ownerName(), "a");
  EXPECT_TRUE(torch::equal(rref->to_here().toTensor(), x + x));
  rref->ready()->wait();
  EXPECT_FALSE(rref->ready()->hasError());
  EXPECT_TRUE(rref->confirmedByOwner());
  EXPECT_EQ(owned_on("a", 1), 1);
  EXPECT_THAT(kind_and_error_of([&] { rref->local_value(); }), HasSubstr("InvalidArgument: "));
  EXPECT_THAT(kind_and_error_of([&] { rref->local_value(); }), HasSubstr("owner"));
}

TEST(RRef, OwnerFreesTheValueWhenTheLastUserDrops) {
  LocalWorld world(three_peers());
  std::vector<RRefPtr> rrefs;
  for (int i = 0; i < 20; ++i) rrefs.push_back(remote("b", "echo", {torch::full({1000}, i)}));
  EXPECT_EQ(rrefs[7]->to_here().toTensor()[0].item<float>(), 7.0f);
  EXPECT_EQ(owned_on("b", 20), 20);
  rrefs.resize(5);
  EXPECT_EQ(owned_on("b", 5), 5);
  rrefs.clear();
  EXPECT_EQ(owned_on("b", 0), 0);
}

TEST(RRef, PassedBetweenThreeWorkersAndFreedAfterAll) {
  LocalWorld world(three_peers());
  at::Tensor x = torch::arange(0, 10);
  RRefPtr rref = remote("c", "echo", {x});  // owner c, created by the master
  // The master hands it to a, which reads it from c.
  EXPECT_TRUE(torch::equal(rpc_sync("a", "rref_value", {to_ivalue(rref)}).toTensor(), x));
  // a hands it on to b, which reads it from c: the RRef crosses three workers.
  c10::IValue through =
      rpc_sync("a", "relay", {std::string("b"), std::string("rref_value"), to_ivalue(rref)});
  EXPECT_TRUE(torch::equal(through.toTensor(), x));
  EXPECT_EQ(rpc_sync("b", "rref_owner", {to_ivalue(rref)}).toStringRef(), "c");
  // Echoed back, the master gets an equal reference.
  RRefPtr back = to_rref(rpc_sync("a", "echo", {to_ivalue(rref)}));
  EXPECT_EQ(back->id(), rref->id());
  EXPECT_FALSE(back->fork_id() == rref->fork_id());
  EXPECT_EQ(owned_on("c", 1), 1);
  rref.reset();
  EXPECT_EQ(owned_on("c", 1), 1);  // `back` still holds it
  back.reset();
  EXPECT_EQ(owned_on("c", 0), 0);
}

TEST(RRef, AnRRefMadeByAPeerAndReturnedOutlivesItsCreator) {
  LocalWorld world(three_peers());
  // a asks b to make the value and returns the RRef to the master; a's own copy is dropped.
  RRefPtr rref = to_rref(rpc_sync(
      "a", "make_remote", {std::string("b"), std::string("echo"), std::string("kept on b")}));
  EXPECT_EQ(rref->ownerName(), "b");
  EXPECT_EQ(rref->to_here().toStringRef(), "kept on b");
  EXPECT_EQ(owned_on("b", 1), 1);
  rref.reset();
  EXPECT_EQ(owned_on("b", 0), 0);
}

TEST(RRef, ValueSentBackToItsOwnerIsTheOwnersOwn) {
  LocalWorld world(three_peers());
  RRefPtr rref = remote("a", "echo", {int64_t{41}});
  // On a, the argument is a's own value: rref_value reads it locally.
  EXPECT_EQ(rpc_sync("a", "rref_value", {to_ivalue(rref)}).toInt(), 41);
  EXPECT_EQ(rpc_sync("a", "rref_owner", {to_ivalue(rref)}).toStringRef(), "a");
  rref.reset();
  EXPECT_EQ(owned_on("a", 0), 0);
}

TEST(RRef, MasterCanOwnValuesToo) {
  LocalWorld world(three_peers());
  RRefPtr mine = remote("master", "echo", {std::string("local")});
  EXPECT_TRUE(mine->isOwner());
  EXPECT_EQ(mine->to_here().toStringRef(), "local");
  EXPECT_EQ(mine->local_value().toStringRef(), "local");
  EXPECT_EQ(rpc_sync("c", "rref_value", {to_ivalue(mine)}).toStringRef(), "local");
  EXPECT_EQ(agent().owned_rref_count(), 1u);
  mine.reset();
  ferry::testing::wait_until([] { return agent().owned_rref_count() == 0; },
                             std::chrono::seconds(5));
  EXPECT_EQ(agent().owned_rref_count(), 0u);
}

TEST(RRef, ErrorsOfTheRemoteFunctionSurfaceAtToHere) {
  LocalWorld world(three_peers());
  RRefPtr rref = remote("a", "fail", {std::string("no stage here")});
  try {
    rref->to_here();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::RemoteException);
    EXPECT_NE(std::string(e.what()).find("no stage here"), std::string::npos) << e.what();
  }
  RRefPtr unknown = remote("a", "no_such_function", {});
  FuturePtr ready = unknown->ready();
  ready->wait();
  ASSERT_TRUE(ready->hasError());
  EXPECT_NE(ready->tryRetrieveErrorMessage().find("no function \"no_such_function\""),
            std::string::npos)
      << ready->tryRetrieveErrorMessage();
  EXPECT_THAT(kind_and_error_of([] { remote("nobody", "echo", {}); }),
              HasSubstr("InvalidArgument: no worker is named \"nobody\""));
}

TEST(RRef, ToHereFailsPromptlyWhenTheOwnerDied) {
  LocalWorld::Settings settings = three_peers();
  settings.shutdown_timeout = milliseconds(2000);
  LocalWorld world(settings);
  RRefPtr rref = remote("b", "echo", {int64_t{1}});
  EXPECT_EQ(rref->to_here().toInt(), 1);
  world.peer(1).kill(SIGKILL);
  ASSERT_TRUE(world.peer(1).wait(testing::scaled(std::chrono::seconds(10))));
  auto start = Clock::now();
  try {
    rref->to_here();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::PeerDied);
    EXPECT_NE(std::string(e.what()).find("worker \"b\""), std::string::npos) << e.what();
  }
  // The owner is known dead: no deadline (20 s) is waited for.
  EXPECT_LT(Clock::now() - start, testing::scaled(std::chrono::seconds(10)));
}

}  // namespace
}  // namespace ferry::rpc
