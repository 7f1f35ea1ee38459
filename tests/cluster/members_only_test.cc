// With a cluster secret, a running training job serves nobody without it: every port its master
// and a worker listen on (found in /proc, as a port scan would) takes a valid-looking store
// request and random bytes from a process without the secret, gives it nothing but a challenge
// and a refusal, and closes; and the job trains on to its end.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "rpc/store_protocol.h"
#include "tests/cluster/job_world.h"
#include "tests/support/wait.h"

namespace {

using ferry::testing::kJobTime;
using ferry::testing::World;

const char* kSecret = "only members know this";

// The TCP ports `pid` listens on: its sockets' inodes, looked up in its network namespace's
// tables.
std::set<int> listening_ports(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& entry : std::filesystem::directory_iterator(fds)) {
    std::error_code error;
    std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (!error && target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::set<int> ports;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in("/proc/" + std::to_string(pid) + table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if (state == "0A" && inodes.count(inode) > 0) {
        ports.insert(std::stoi(local.substr(local.find(':') + 1), nullptr, 16));
      }
    }
  }
  return ports;
}

// What one port did with a stranger: whether it spoke first (Ferry's ports send a challenge),
// what it sent in all, and whether it closed the connection.
struct Probe {
  int port = 0;
  bool greeted = false;
  bool closed = false;
  std::string received;
};

Probe probe(int port, const std::string& garbage) {
  Probe result;
  result.port = port;
  int fd = -1;
  try {
    fd = ferry::testing::connect_raw({"a listening port", 0, "127.0.0.1", port});
  } catch (const std::runtime_error&) {
    result.closed = true;
    return result;
  }
  auto read_for = [&](int ms) {
    char buf[4096];
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, ms) <= 0) return;
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        result.closed = true;
        return;
      }
      result.received.append(buf, static_cast<std::size_t>(n));
    }
  };
  read_for(500);
  result.greeted = !result.received.empty();
  ::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
  read_for(static_cast<int>(ferry::testing::scaled(std::chrono::seconds(5)).count()));
  ::close(fd);
  return result;
}

// A store request as a member would send it (a set of a worker's address), then noise.
std::string stranger_bytes() {
  ferry::rpc::store::Request set;
  set.op = ferry::rpc::store::Op::Set;
  set.keys = {"ferry/worker/1"};
  set.value = "intruder\n10.9.9.9\n4000";
  std::string bytes = ferry::rpc::store::framed(ferry::rpc::store::encode(set));
  std::mt19937 random(7);
  for (int i = 0; i < 512; ++i) bytes.push_back(static_cast<char>(random()));
  return bytes;
}

TEST(MembersOnly, NoPortOfARunningJobServesAProcessWithoutTheSecret) {
  // Two replicas of two stages whose batch norms sum over both: Gloo groups beside the agents.
  World world("members-only",
              "--model unet-resnet18 --image-size 32 --samples 200 --batch-size 8 --epochs 3 "
              "--replicas 2 --partition decoder.0 --pipeline gpipe --microbatches 2 "
              "--sync-batchnorm",
              4, {{"FERRY_SECRET", kSecret}});
  const std::regex training(R"(epoch 1/3 \[[#.]*\] [1-9])");
  ASSERT_TRUE(ferry::testing::wait_until([&] { return std::regex_search(world.log(), training); },
                                         kJobTime, std::chrono::milliseconds(10)))
      << world.log();

  const std::string garbage = stranger_bytes();
  std::vector<Probe> probes;
  std::map<std::string, int> greeting_ports;
  for (auto [who, pid] : {std::pair<std::string, pid_t>{"master", world.master->pid()},
                          {"worker1", world.workers[0]->pid()}}) {
    for (int port : listening_ports(pid)) {
      probes.push_back(probe(port, garbage));
      const Probe& p = probes.back();
      std::cout << who << " port " << p.port << ": " << (p.greeted ? "challenged, " : "silent, ")
                << p.received.size() << " bytes back, " << (p.closed ? "closed" : "left open")
                << "\n";
      if (p.greeted) ++greeting_ports[who];
    }
  }
  // Still training after every probe.
  EXPECT_FALSE(world.master->wait(std::chrono::milliseconds(0)).has_value()) << world.log();

  // The master's store and agent, and the worker's agent, at least.
  EXPECT_GE(greeting_ports["master"], 2);
  EXPECT_GE(greeting_ports["worker1"], 1);
  for (const Probe& p : probes) {
    // No worker's address (every one is on 127.0.0.1) came back from anywhere.
    EXPECT_EQ(p.received.find("127.0.0.1"), std::string::npos) << "port " << p.port;
    if (p.greeted) {
      EXPECT_TRUE(p.closed) << "port " << p.port;
    }
  }

  std::optional<int> status = world.master->wait(kJobTime);
  ASSERT_TRUE(status.has_value()) << world.log();
  const std::string log = world.log();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << log;
  EXPECT_TRUE(std::regex_search(
      log, std::regex(R"(store: (rejected|closing) the connection from 127\.0\.0\.1)")))
      << log;
  for (auto& worker : world.workers) {
    std::optional<int> exit = worker->wait(std::chrono::seconds(20));
    EXPECT_TRUE(exit.has_value() && WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0);
  }
}

}  // namespace
