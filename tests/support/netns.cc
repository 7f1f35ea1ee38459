#include "tests/support/netns.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "ferry/core/processes.h"

namespace ferry::testing {
namespace {

// Runs a shell command; throws with its output if it fails.
void sh(const std::string& command) {
  core::CommandOutput ran = core::run_command(command);
  if (ran.status != 0) throw std::runtime_error(command + ": " + ran.output);
}

// Runs a shell command whose failure does not matter (removing what may not be there).
void sh_quiet(const std::string& command) { core::run_command(command + " >/dev/null 2>&1"); }

// Removes namespaces and bridges of earlier test processes that are gone.
void remove_leftovers() {
  std::istringstream lines(core::run_command("ip netns list 2>/dev/null", false).output);
  std::vector<std::string> stale;
  for (std::string line; std::getline(lines, line);) {
    int pid = 0, host = 0;
    if (std::sscanf(line.c_str(), "ferry-%d-h%d", &pid, &host) == 2 && kill(pid, 0) != 0) {
      stale.push_back(fmt::format("ferry-{}-h{}", pid, host));
      stale.push_back(fmt::format("fb{}", pid));
    }
  }
  for (const auto& name : stale) {
    if (name.rfind("ferry-", 0) == 0) {
      sh_quiet("ip netns del " + name);
    } else {
      sh_quiet("ip link del " + name + "a");
      sh_quiet("ip link del " + name + "b");
    }
  }
}

}  // namespace

bool NetnsCluster::available() {
  return geteuid() == 0 && std::system("ip netns list >/dev/null 2>&1") == 0;
}

NetnsCluster::NetnsCluster(int hosts, LinkShaping shaping)
    : subnet_(static_cast<int>(getpid() % 200) + 20), prefix_(fmt::format("fb{}", getpid())) {
  remove_leftovers();
  try {
    for (const char* side : {"a", "b"}) {
      sh(fmt::format("ip link add {}{} type bridge", prefix_, side));
      sh(fmt::format("ip link set {}{} up", prefix_, side));
    }
    for (int h = 0; h < hosts; ++h) {
      std::string name = fmt::format("ferry-{}-h{}", getpid(), h);
      sh("ip netns add " + name);
      names_.push_back(name);
      sh(fmt::format("ip netns exec {} ip link set lo up", name));
      for (int i = 0; i < 2; ++i) {
        std::string outside = fmt::format("{}{}{}", prefix_, h, i == 0 ? "a" : "b");
        std::string inside = fmt::format("eth{}", i);
        sh(fmt::format("ip link add {} type veth peer name {} netns {}", outside, inside, name));
        sh(fmt::format("ip link set {} master {}{} up", outside, prefix_, i == 0 ? "a" : "b"));
        sh(fmt::format("ip netns exec {} ip addr add {}/24 dev {}", name,
                       i == 0 ? address(h) : second_address(h), inside));
        sh(fmt::format("ip netns exec {} ip link set {} up", name, inside));
      }
      if (!shaping.rate.empty()) {
        sh(
            fmt::format("ip netns exec {} tc qdisc add dev eth0 root tbf rate {} burst 64kb "
                        "latency {}",
                        name, shaping.rate, shaping.latency));
      }
    }
  } catch (...) {
    tear_down();
    throw;
  }
}

NetnsCluster::~NetnsCluster() { tear_down(); }

void NetnsCluster::tear_down() {
  for (auto& p : processes_) p.reset();  // kills what still runs
  processes_.clear();
  for (const auto& name : names_) sh_quiet("ip netns del " + name);
  names_.clear();
  sh_quiet(fmt::format("ip link del {}a", prefix_));
  sh_quiet(fmt::format("ip link del {}b", prefix_));
}

std::string NetnsCluster::address(int host) const {
  return fmt::format("10.213.{}.{}", subnet_, host + 1);
}

std::string NetnsCluster::second_address(int host) const {
  return fmt::format("10.214.{}.{}", subnet_, host + 1);
}

Process& NetnsCluster::run(int host, const std::string& command,
                           const std::map<std::string, std::string>& env, const std::string& log) {
  processes_.push_back(
      std::make_unique<Process>("/usr/sbin/ip",
                                std::vector<std::string>{"netns", "exec", ns(host), "/bin/sh", "-c",
                                                         "exec " + command + " > " + log + " 2>&1"},
                                env));
  return *processes_.back();
}

}  // namespace ferry::testing
