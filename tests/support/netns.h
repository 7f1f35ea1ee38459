// Hosts on one machine for multi-host tests: network namespaces joined by two bridges, each host
// with its own IPv4 address on a private test subnet (eth0) and a second one on another subnet
// (eth1), optionally shaped with `tc tbf`. Everything is named after this process's id, made by
// the constructor and removed by the destructor, also when a test fails; leftovers of test
// processes that died are removed first. Traffic goes only to these addresses and loopback.
// Needs root (CAP_NET_ADMIN) and iproute2.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/cluster.h"

namespace ferry::testing {

// Bandwidth and queueing latency of every host's eth0 (tc tbf).
struct LinkShaping {
  std::string rate;  // e.g. "100mbit"; empty: no shaping
  std::string latency = "50ms";
};

class NetnsCluster {
 public:
  // Throws std::runtime_error saying which command failed.
  explicit NetnsCluster(int hosts, LinkShaping shaping = LinkShaping());
  ~NetnsCluster();
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  // Whether this machine lets a test make namespaces (root, iproute2).
  static bool available();

  const std::string& ns(int host) const { return names_.at(host); }
  // Host `host`'s address on eth0 (subnet A) or eth1 (subnet B).
  std::string address(int host) const;
  std::string second_address(int host) const;

  // Runs `command` (a shell command line) in `host`'s namespace with `env` added; its output
  // goes to `log`. The process is killed when the cluster goes, if still running.
  Process& run(int host, const std::string& command, const std::map<std::string, std::string>& env,
               const std::string& log);

 private:
  void tear_down();

  int subnet_;
  std::string prefix_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<Process>> processes_;
};

}  // namespace ferry::testing
