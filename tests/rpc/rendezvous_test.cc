// Start-up failures: every rank fails within its timeout, and the error names who is at fault.
#include "rpc/rendezvous.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "ferry/core/local_world.h"
#include "ferry/rpc/agent.h"
#include "ferry/rpc/error.h"
#include "tests/support/cluster.h"
#include "tests/support/error_of.h"
#include "tests/support/sanitizer_allowance.h"
#include "tests/support/time_scale.h"

namespace ferry::rpc {
namespace {

using ferry::testing::kind_and_error_of;
using ::testing::HasSubstr;

using ferry::testing::Process;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::unique_ptr<Process> spawn_peer(int rank, int world, const std::string& port_file,
                                    const std::string& name, int timeout_ms) {
  return std::make_unique<Process>(
      ferry::testing::peer_binary(),
      std::vector<std::string>{"--name", name, "--init-timeout-ms", std::to_string(timeout_ms)},
      ferry::core::loopback_world_env(rank, world, 0, port_file));
}

Options master_options(int world, const std::string& port_file, milliseconds timeout) {
  // The master takes its port from the system and writes it to the file, where the peers read it.
  Options o = loopback_options("master", 0, world, 0);
  o.master_port_file = port_file;
  o.init_timeout = timeout;
  return o;
}

std::string start_error(const Options& options) {
  FunctionRegistry registry;
  try {
    Agent::start(options, registry);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Init);
    return e.what();
  }
  return "started";
}

int exit_code(Process& p) {
  auto status = p.wait(milliseconds(10000));
  if (!status) return -1;
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
}

TEST(Rendezvous, DuplicateWorkerNameFailsEveryRank) {
  const std::string port = ferry::testing::new_port_file();
  auto p1 = spawn_peer(1, 3, port, "twin", 10000);
  auto p2 = spawn_peer(2, 3, port, "twin", 10000);
  std::string error = start_error(master_options(3, port, milliseconds(10000)));
  EXPECT_EQ(error, "rank 0: worker names must be unique: \"twin\" is used by ranks 1, 2");
  EXPECT_EQ(exit_code(*p1), 2);
  EXPECT_EQ(exit_code(*p2), 2);
}

TEST(Rendezvous, IncompleteWorldFailsWithinItsTimeoutNamingTheMissingRank) {
  const std::string port = ferry::testing::new_port_file();
  // Long enough for rank 1's process to start (LibTorch loading) on a loaded machine.
  const milliseconds timeout = ferry::testing::scaled(std::chrono::seconds(4));
  auto p1 = spawn_peer(1, 3, port, "a", static_cast<int>(timeout.count()));
  auto start = Clock::now();
  std::string error = start_error(master_options(3, port, timeout));
  EXPECT_LT(Clock::now() - start, timeout + ferry::testing::scaled(std::chrono::seconds(5)));
  EXPECT_EQ(error,
            "rank 0: the world of 3 did not complete in time: rank 2 never joined "
            "(joined: 0, 1)");
  EXPECT_EQ(exit_code(*p1), 2);
}

TEST(Rendezvous, UnreachableMasterFailsWithinItsTimeout) {
  int port = ferry::testing::free_port();
  Options o = loopback_options("master", 0, 2, port);
  o.init_timeout = milliseconds(1000);
  o.rank = 1;
  o.name = "lonely";
  auto start = Clock::now();
  std::string error = start_error(o);
  EXPECT_LT(Clock::now() - start, ferry::testing::scaled(std::chrono::seconds(5)));
  EXPECT_NE(error.find("rank 1 could not reach the master at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << error;
}

// A master whose port file never appears: the rank waits for it within its timeout, then says
// which file it waited for.
TEST(Rendezvous, ARankWhosePortFileNeverAppearsFailsWithinItsTimeoutNamingTheFile) {
  const std::string port = ferry::testing::new_port_file();
  Options o = master_options(2, port, milliseconds(1000));
  o.rank = 1;
  o.name = "lonely";
  auto start = Clock::now();
  std::string error = start_error(o);
  EXPECT_LT(Clock::now() - start, ferry::testing::scaled(std::chrono::seconds(5)));
  EXPECT_EQ(error, "rank 1: rank 0 did not write its port to " + port + " within 1.0 s");
}

TEST(Rendezvous, ShutdownWaitsForEveryAgentAndReturns) {
  const std::string port = ferry::testing::new_port_file();
  auto p1 = spawn_peer(1, 2, port, "a", 10000);
  FunctionRegistry registry;
  auto agent = Agent::start(master_options(2, port, milliseconds(10000)), registry);
  auto start = Clock::now();
  agent->shutdown();
  EXPECT_LT(Clock::now() - start, ferry::testing::scaled(std::chrono::seconds(5)));
  EXPECT_EQ(exit_code(*p1), 0);
  EXPECT_THAT(kind_and_error_of([&] { agent->call_async("a", "echo", {}); }),
              HasSubstr("Shutdown: cannot call \"echo\": the agent of master is not running"));
}

// A port-0 bind (every agent's listener) lands in the ephemeral range, so a master port picked
// from it could be taken by an agent before the store binds it.
TEST(PickFreePort, ComesFromBelowTheKernelsEphemeralRange) {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  ASSERT_TRUE(range >> low);
  for (int i = 0; i < 50; ++i) {
    int port = core::pick_free_port();
    EXPECT_GE(port, 1024);
    EXPECT_LT(port, low);
  }
}

TEST(Rendezvous, AMasterPortAnotherProcessListensOnFailsAtRankZeroNamingThePort) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  int on = 1;
  // As libuv does for every listener, so the store's bind meets what an agent's would.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 16), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  int port = ntohs(addr.sin_port);
  Options o = loopback_options("master", 0, 2, port);
  o.init_timeout = milliseconds(1000);
  std::string error = start_error(o);
  ::close(fd);
  EXPECT_NE(
      error.find("rank 0 could not host the rendezvous store on port " + std::to_string(port)),
      std::string::npos)
      << error;
}

}  // namespace
}  // namespace ferry::rpc

namespace ferry::rpc {
namespace {

TEST(ListenHost, FollowsTheRouteToTheMaster) {
  EXPECT_EQ(choose_listen_host("127.0.0.1", ""), "127.0.0.1");
  EXPECT_EQ(choose_listen_host("localhost", ""), "127.0.0.1");
}

TEST(ListenHost, NamedInterfaceWinsAndAnUnknownOneIsNamed) {
  EXPECT_EQ(choose_listen_host("10.255.255.1", "lo"), "127.0.0.1");
  try {
    choose_listen_host("127.0.0.1", "nope0");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("interface \"nope0\" (FERRY_IFNAME) has no IPv4 address; "
                                         "interfaces with one: lo"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ferry::rpc
