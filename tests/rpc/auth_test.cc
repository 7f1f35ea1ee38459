// The handshake's shared-secret authentication: a world whose agents share FERRY_SECRET works;
// a process with another secret cannot join, and the master's error names the rank refused; a raw
// client that cannot prove the secret, or replays a proof made for another connection, gets nothing
// but the challenge; one that proves it is served; a client that never says hello is closed.
#include "rpc/auth.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ferry/core/backoff.h"
#include "ferry/rpc/agent.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "rpc/frame.h"
#include "rpc/store_client.h"
#include "tests/support/cluster.h"
#include "tests/support/error_of.h"
#include "tests/support/time_scale.h"

namespace {

using ferry::rpc::Handshake;
using ferry::rpc::HandshakeStep;
using ferry::rpc::Message;
using ferry::rpc::MessageKind;
using ferry::rpc::WorkerInfo;
using ferry::testing::LocalWorld;

const char* kSecret = "correct horse battery staple";

LocalWorld::Settings with_secret(const std::string& secret) {
  LocalWorld::Settings settings;
  settings.secret = secret;
  settings.env["FERRY_SECRET"] = secret;
  return settings;
}

// A client speaking the wire protocol by hand, as an attacker or another implementation would.
class RawClient {
 public:
  explicit RawClient(const WorkerInfo& to) : fd_(ferry::testing::connect_raw(to)) {}
  ~RawClient() { ::close(fd_); }

  void send(const Message& message) {
    ferry::rpc::EncodedFrame frame = ferry::rpc::encode_frame(message);
    std::string bytes(frame.head.begin(), frame.head.end());
    ASSERT_EQ(::write(fd_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }

  // The next message, or nothing once the agent closed the connection (or after 5 s).
  std::optional<Message> receive() {
    while (received_.empty()) {
      char buf[4096];
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) return std::nullopt;
      decoder_.consume(buf, static_cast<size_t>(n), &received_);
    }
    Message next = std::move(received_.front());
    received_.erase(received_.begin());
    return next;
  }

  // Every message until the agent closes the connection; `closed` says whether it did.
  std::vector<Message> drain(bool* closed) {
    std::vector<Message> out;
    *closed = false;
    for (int i = 0; i < 64; ++i) {
      std::optional<Message> m = receive();
      if (!m) {
        char byte;
        ssize_t n = ::read(fd_, &byte, 1);
        *closed = n == 0 || (n < 0 && errno == ECONNRESET);
        return out;
      }
      out.push_back(std::move(*m));
    }
    return out;
  }

 private:
  int fd_;
  ferry::rpc::FrameDecoder decoder_{ferry::rpc::FrameLimits{}};
  std::vector<Message> received_;
};

Message hello(int rank, const std::string& name, Handshake handshake) {
  Message m;
  m.kind = MessageKind::Control;
  m.peer_rank = rank;
  m.peer_name = name;
  m.handshake = std::move(handshake);
  return m;
}

Message echo_request(std::int64_t value) {
  Message m;
  m.kind = MessageKind::Request;
  m.id = 1;
  m.function = "echo";
  m.value = c10::ivalue::Tuple::create({c10::IValue(value)});
  return m;
}

std::string challenge_from(RawClient& client) {
  std::optional<Message> first = client.receive();
  EXPECT_TRUE(first.has_value());
  if (!first) return {};
  EXPECT_EQ(first->kind, MessageKind::Control);
  EXPECT_EQ(first->handshake.step, HandshakeStep::Challenge);
  EXPECT_EQ(first->handshake.challenge.size(), ferry::rpc::auth::kNonceBytes);
  return first->handshake.challenge;
}

bool any_response(const std::vector<Message>& messages) {
  for (const Message& m : messages) {
    if (m.kind != MessageKind::Control) return true;
  }
  return false;
}

TEST(Auth, AWorldSharingASecretCallsAcrossEveryConnection) {
  LocalWorld world(with_secret(kSecret));
  EXPECT_EQ(ferry::rpc::rpc_sync("a", "echo", {int64_t{5}}).toInt(), 5);
  // a -> b is a connection between two peers, authenticated the same way.
  EXPECT_EQ(ferry::rpc::rpc_sync("a", "relay", {std::string("b"), std::string("echo"), int64_t{9}})
                .toInt(),
            9);
}

// The rendezvous store asks for the secret too: a process claiming rank 1 with another secret
// is refused at once and told why, and the master's error, when its world does not complete,
// names the rank and why the store refused it. (The refused side's own message, through a
// worker's start-up, is StoreServer.AClientWithAnotherSecretIsRefusedAndToldWhy's.)
TEST(Auth, TheMastersErrorNamesTheRankTheStoreRefused) {
  ferry::rpc::Options master = ferry::rpc::loopback_options("master", 0, 2, 0);
  master.master_port_file = ferry::testing::new_port_file();
  master.init_timeout = ferry::testing::scaled(std::chrono::seconds(3));
  master.secret = kSecret;
  std::string master_error;
  std::thread start([&] {
    ferry::rpc::FunctionRegistry registry;
    master_error = ferry::testing::error_of([&] { ferry::rpc::Agent::start(master, registry); });
  });
  int port = 0;
  ferry::core::poll_with_backoff(
      [&] {
        port = std::atoi(ferry::testing::read_file(master.master_port_file).c_str());
        return port > 0;
      },
      std::chrono::steady_clock::now() + ferry::testing::scaled(std::chrono::seconds(10)));
  std::string refused = ferry::testing::error_of([&] {
    ferry::rpc::store::StoreClient(
        {"127.0.0.1", port, 1, "impostor", "another secret", std::chrono::milliseconds(5000)},
        std::chrono::steady_clock::now() + std::chrono::seconds(5));
  });
  start.join();
  EXPECT_NE(refused.find("its proof of the cluster secret is wrong (is FERRY_SECRET the same on "
                         "both?)"),
            std::string::npos)
      << refused;
  EXPECT_NE(master_error.find("rank 1 never joined (joined: 0); the store refused a process "
                              "claiming rank 1 from 127.0.0.1:"),
            std::string::npos)
      << master_error;
  EXPECT_NE(master_error.find("its proof of the cluster secret is wrong"), std::string::npos)
      << master_error;
}

TEST(Auth, ARawClientWithoutTheSecretGetsOnlyTheChallenge) {
  LocalWorld world(with_secret(kSecret));
  const WorkerInfo& a = world.master().worker("a");
  {
    // No proof at all, and a request right behind the hello.
    RawClient client(a);
    std::string challenge = challenge_from(client);
    client.send(hello(1, "intruder", {HandshakeStep::Hello, challenge, std::string(32, 'n'), ""}));
    client.send(echo_request(7));
    bool closed;
    std::vector<Message> rest = client.drain(&closed);
    EXPECT_TRUE(closed);
    EXPECT_FALSE(any_response(rest));
  }
  {
    // A proof made with a guessed secret.
    RawClient client(a);
    std::string challenge = challenge_from(client);
    std::string nonce(32, 'n');
    client.send(hello(1, "intruder",
                      {HandshakeStep::Hello, challenge, nonce,
                       ferry::rpc::auth::hello_proof("guess", challenge, nonce, 1, "intruder")}));
    client.send(echo_request(7));
    bool closed;
    EXPECT_FALSE(any_response(client.drain(&closed)));
    EXPECT_TRUE(closed);
  }
  {
    // A valid proof replayed from another connection answers another challenge.
    RawClient earlier(a);
    std::string old_challenge = challenge_from(earlier);
    RawClient client(a);
    challenge_from(client);
    std::string nonce(32, 'n');
    client.send(
        hello(1, "intruder",
              {HandshakeStep::Hello, old_challenge, nonce,
               ferry::rpc::auth::hello_proof(kSecret, old_challenge, nonce, 1, "intruder")}));
    client.send(echo_request(7));
    bool closed;
    EXPECT_FALSE(any_response(client.drain(&closed)));
    EXPECT_TRUE(closed);
  }
  // The agent serves its world as before.
  EXPECT_EQ(ferry::rpc::rpc_sync("a", "echo", {int64_t{5}}).toInt(), 5);
}

TEST(Auth, AClientProvingTheSecretIsWelcomedWithTheAgentsOwnProofAndServed) {
  LocalWorld world(with_secret(kSecret));
  RawClient client(world.master().worker("a"));
  std::string challenge = challenge_from(client);
  std::string nonce = ferry::rpc::auth::fresh_nonce();
  client.send(hello(2, "b-again",
                    {HandshakeStep::Hello, challenge, nonce,
                     ferry::rpc::auth::hello_proof(kSecret, challenge, nonce, 2, "b-again")}));
  std::optional<Message> welcome = client.receive();
  ASSERT_TRUE(welcome.has_value());
  EXPECT_EQ(welcome->handshake.step, HandshakeStep::Welcome);
  EXPECT_TRUE(ferry::rpc::auth::proofs_equal(
      ferry::rpc::auth::welcome_proof(kSecret, challenge, nonce), welcome->handshake.proof));
  EXPECT_FALSE(ferry::rpc::auth::proofs_equal(
      ferry::rpc::auth::welcome_proof("guess", challenge, nonce), welcome->handshake.proof));
  client.send(echo_request(7));
  std::optional<Message> reply = client.receive();
  ASSERT_TRUE(reply.has_value());
  ASSERT_EQ(reply->kind, MessageKind::Response);
  EXPECT_EQ(reply->value.toInt(), 7);
}

TEST(Auth, AClientThatNeverSaysHelloIsClosed) {
  LocalWorld::Settings settings;
  settings.handshake_timeout = std::chrono::milliseconds(300);
  LocalWorld world(settings);
  RawClient client(world.master().self());
  challenge_from(client);
  auto start = std::chrono::steady_clock::now();
  bool closed;
  client.drain(&closed);
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            ferry::testing::scaled(std::chrono::seconds(3)));
}

}  // namespace
