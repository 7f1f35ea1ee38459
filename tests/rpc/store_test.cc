// The rendezvous store: its operations mean what c10d::Store's mean; a server with a secret
// serves only clients that prove it, and proves it back; a client without it, or one sending
// garbage, reads and writes nothing and is closed, while members go on being served.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "ferry/rpc/error.h"
#include "rpc/store_client.h"
#include "rpc/store_server.h"
#include "rpc/store_table.h"
#include "tests/support/cluster.h"
#include "tests/support/error_of.h"
#include "tests/support/wait.h"

namespace ferry::rpc::store {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

const char* kSecret = "correct horse battery staple";

Request one(Op op, const std::string& key) {
  Request request;
  request.op = op;
  request.keys = {key};
  return request;
}

Request adding(const std::string& key, std::int64_t amount) {
  Request request = one(Op::Add, key);
  request.amount = amount;
  return request;
}

Request getting(const std::string& key, std::int64_t timeout_ms) {
  Request request = one(Op::Get, key);
  request.timeout_ms = timeout_ms;
  return request;
}

Request comparing(const std::string& key, const std::string& expected, const std::string& desired) {
  Request request = one(Op::CompareSet, key);
  request.value = expected;
  request.desired = desired;
  return request;
}

TEST(StoreTable, AddCountsFromZeroAndKeepsTheCountAsDecimalText) {
  StoreTable table;
  EXPECT_EQ(table.apply(adding("n", 3)).number, 3);
  EXPECT_EQ(table.apply(adding("n", -5)).number, -2);
  EXPECT_EQ(table.apply(getting("n", 0)).value, "-2");
}

TEST(StoreTable, AddRefusesAKeyThatHoldsSomethingElse) {
  StoreTable table;
  Request set = one(Op::Set, "address");
  set.value = "10.0.0.1";
  table.apply(set);
  Reply reply = table.apply(adding("address", 1));
  EXPECT_FALSE(reply.ok);
  EXPECT_EQ(reply.error, "store key \"address\" holds a value that is not a number");
}

TEST(StoreTable, CompareSetSetsOnlyWhereTheExpectedValueIs) {
  StoreTable table;
  // A missing key counts as empty: expecting something else leaves it missing.
  EXPECT_EQ(table.apply(comparing("k", "x", "y")).value, "x");
  EXPECT_EQ(table.apply(one(Op::Check, "k")).number, 0);
  EXPECT_EQ(table.apply(comparing("k", "", "first")).value, "first");
  EXPECT_EQ(table.apply(comparing("k", "other", "second")).value, "first");
  EXPECT_EQ(table.apply(comparing("k", "first", "second")).value, "second");
}

TEST(StoreTable, DeleteCheckAndCountSeeTheSameKeys) {
  StoreTable table;
  table.apply(adding("a", 1));
  table.apply(adding("b", 1));
  Request both;
  both.op = Op::Check;
  both.keys = {"a", "b"};
  EXPECT_EQ(table.apply(both).number, 1);
  EXPECT_EQ(table.apply(one(Op::DeleteKey, "a")).number, 1);
  EXPECT_EQ(table.apply(one(Op::DeleteKey, "a")).number, 0);
  EXPECT_EQ(table.apply(both).number, 0);
  EXPECT_EQ(table.apply(Request{Op::NumKeys, {}, {}, {}, 0, 0}).number, 1);
}

TEST(StoreTable, AGetWaitsForItsKeyAndOtherwiseTimesOutNamingIt) {
  StoreTable table;
  Reply missing = table.apply(getting("late", 20));
  EXPECT_FALSE(missing.ok);
  EXPECT_EQ(missing.error, "waited 20 ms for store keys that did not appear: late");
  std::thread setter([&] {
    // Set once the get waits for it, so the wait is what finds it.
    ferry::testing::wait_until([&] { return table.waiting() == 1; }, std::chrono::seconds(10));
    Request set = one(Op::Set, "late");
    set.value = "here";
    table.apply(set);
  });
  Reply found = table.apply(getting("late", 60000));
  setter.join();
  EXPECT_TRUE(found.ok);
  EXPECT_EQ(found.value, "here");
}

// The calls are waiting when the table closes (the table says so first), and each fails at once
// though it would wait ten minutes; a call after the close fails without waiting.
TEST(StoreTable, ClosingWakesEveryWaitingCall) {
  StoreTable table;
  Reply replies[2];
  std::thread waiters[2];
  for (int k = 0; k < 2; ++k) {
    waiters[k] = std::thread([&, k] { replies[k] = table.apply(getting("never", 600000)); });
  }
  const bool both_waiting =
      ferry::testing::wait_until([&] { return table.waiting() == 2; }, std::chrono::seconds(10));
  table.close();
  for (std::thread& waiter : waiters) waiter.join();
  ASSERT_TRUE(both_waiting);
  EXPECT_EQ(table.waiting(), 0u);
  for (const Reply& reply : replies) {
    EXPECT_FALSE(reply.ok);
    EXPECT_EQ(reply.error, "the store is closing");
  }
  const Reply late = table.apply(getting("never", 600000));
  EXPECT_FALSE(late.ok);
  EXPECT_EQ(late.error, "the store is closing");
}

ServerSettings settings_with(const std::string& secret) {
  ServerSettings settings;
  settings.secret = secret;
  settings.world_size = 4;
  settings.handshake_timeout = milliseconds(5000);
  return settings;
}

std::unique_ptr<StoreClient> client_of(const StoreServer& server, int rank,
                                       const std::string& secret) {
  return std::make_unique<StoreClient>(
      ClientSettings{"127.0.0.1", server.port(), rank, "test", secret, milliseconds(5000)},
      Clock::now() + milliseconds(5000));
}

// A plain socket to the server, as an attacker has: what it reads, and whether the server closed.
class RawSocket {
 public:
  explicit RawSocket(int port)
      : fd_(ferry::testing::connect_raw(WorkerInfo{"the store", 0, "127.0.0.1", port})) {
    timeval limit{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  }
  ~RawSocket() { ::close(fd_); }

  void send(const std::string& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  // Everything until the server closes (true), or until 10 s pass with the socket open (false).
  bool read_until_closed(std::string* received) {
    char buf[4096];
    for (;;) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
      received->append(buf, static_cast<std::size_t>(n));
    }
  }

 private:
  int fd_ = -1;
};

TEST(StoreServer, MembersWithTheSecretShareKeys) {
  StoreServer server(settings_with(kSecret));
  auto a = client_of(server, 0, kSecret);
  auto b = client_of(server, 1, kSecret);
  a->set("worker/1", bytes_of("10.0.0.2:4000"));
  EXPECT_EQ(b->get("worker/1"), bytes_of("10.0.0.2:4000"));
  EXPECT_EQ(a->add("joined", 1), 1);
  EXPECT_EQ(b->add("joined", 1), 2);
  EXPECT_TRUE(b->check({"worker/1", "joined"}));
  std::thread later([&] { a->set("go", bytes_of("1")); });
  b->wait({"go"}, milliseconds(10000));
  later.join();
  EXPECT_EQ(b->getNumKeys(), 3);
  EXPECT_TRUE(a->deleteKey("go"));
  EXPECT_FALSE(b->check({"go"}));
}

TEST(StoreServer, AGetThatTimesOutSaysWhichKey) {
  StoreServer server(settings_with(kSecret));
  auto a = client_of(server, 0, kSecret);
  a->setTimeout(milliseconds(50));
  EXPECT_THAT(ferry::testing::error_of([&] { a->get("missing"); }),
              HasSubstr("waited 50 ms for store keys that did not appear: missing"));
  a->set("k", bytes_of("v"));  // the connection still serves
  EXPECT_EQ(a->get("k"), bytes_of("v"));
}

TEST(StoreServer, AClientWithAnotherSecretIsRefusedAndToldWhy) {
  StoreServer server(settings_with(kSecret));
  std::string error = ferry::testing::error_of([&] { client_of(server, 2, "another secret"); });
  EXPECT_THAT(error, HasSubstr("the rendezvous store rejected it: its proof of the cluster secret "
                               "is wrong (is FERRY_SECRET the same on both?)"));
  EXPECT_THAT(server.refusal_of(2),
              ::testing::MatchesRegex("from 127\\.0\\.0\\.1:[0-9]+: its proof of the cluster "
                                      "secret is wrong"));
  EXPECT_EQ(server.refusal_of(1), "");
}

TEST(StoreServer, AClientWithASecretRefusesAServerThatCannotProveIt) {
  StoreServer open(settings_with(""));
  EXPECT_THAT(ferry::testing::error_of([&] { client_of(open, 1, kSecret); }),
              HasSubstr("did not prove that it holds the cluster secret"));
}

TEST(StoreServer, AnOpenServerServesClientsWithoutASecret) {
  StoreServer open(settings_with(""));
  auto a = client_of(open, 0, "");
  EXPECT_EQ(a->add("n", 2), 2);
}

TEST(StoreServer, ARawClientReadsAndWritesNothingAndMembersAreStillServed) {
  StoreServer server(settings_with(kSecret));
  auto member = client_of(server, 0, kSecret);
  member->set("worker/0", bytes_of("the member's address"));

  // A valid request where the hello belongs: a get, and a set.
  for (const Request& request : {getting("worker/0", 0), [] {
                                   Request set = one(Op::Set, "worker/1");
                                   set.value = "the attacker's address";
                                   return set;
                                 }()}) {
    RawSocket raw(server.port());
    raw.send(framed(encode(request)));
    std::string received;
    EXPECT_TRUE(raw.read_until_closed(&received));
    EXPECT_EQ(received.find("the member's address"), std::string::npos);
  }
  EXPECT_FALSE(member->check({"worker/1"}));

  // Random bytes, and a length far past the limit.
  std::string noise(300, '\0');
  for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<char>(i * 131 + 7);
  for (const std::string& garbage : {noise, std::string("\xff\xff\xff\xff", 4)}) {
    RawSocket raw(server.port());
    raw.send(garbage);
    std::string received;
    EXPECT_TRUE(raw.read_until_closed(&received));
  }
  EXPECT_EQ(member->get("worker/0"), bytes_of("the member's address"));
  EXPECT_EQ(member->getNumKeys(), 1);
}

TEST(StoreServer, AClientThatNeverSpeaksIsClosedAfterTheHandshakeTimeout) {
  ServerSettings settings = settings_with(kSecret);
  settings.handshake_timeout = milliseconds(200);
  StoreServer server(settings);
  RawSocket silent(server.port());
  std::string received;
  EXPECT_TRUE(silent.read_until_closed(&received));  // the challenge, then the close
  auto member = client_of(server, 0, kSecret);
  EXPECT_EQ(member->add("n", 1), 1);
}

}  // namespace
}  // namespace ferry::rpc::store
