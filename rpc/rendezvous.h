// The rendezvous: a store hosted by rank 0 (rpc/store_server.h) through which agents publish
// their addresses, find each other, and agree on shutdown. With a cluster secret only members
// reach it. Resource type.
//
// Thread rules: every method may be called from any thread; calls are serialised internally
// because one store client is one socket.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ferry/rpc/options.h"
#include "ferry/rpc/worker_info.h"

namespace ferry::rpc {

namespace store {
class StoreServer;
class StoreClient;
}  // namespace store

class Rendezvous {
 public:
  // Rank 0 starts the store; the others connect within options.init_timeout. Throws Error(Init).
  explicit Rendezvous(const Options& options);
  ~Rendezvous();

  int port() const { return port_; }
  // Publishes `self` and waits until every rank has; returns all workers ordered by rank. Throws
  // Error(Init) naming the ranks that never joined, or the ranks whose names clash.
  std::vector<WorkerInfo> join(const WorkerInfo& self,
                               std::chrono::steady_clock::time_point deadline);

  // Shutdown barrier. arrive_shutdown() says this rank is done; missing_shutdown() lists ranks
  // that have not, after publishing `lost` (ranks this agent saw die) so no agent waits for them.
  void arrive_shutdown();
  bool shutdown_started();
  std::vector<int> missing_shutdown(const std::set<int>& lost);
  // After the barrier: non-zero ranks say they no longer need the store; rank 0 waits for that
  // before taking the store down with it.
  void leave();
  void wait_left(const std::set<int>& ignore, std::chrono::steady_clock::time_point deadline);

 private:
  // On rank 0: why the store refused processes that claimed these ranks, as a tail to an error.
  std::string refusals(const std::vector<int>& ranks);

  int rank_;
  int world_size_;
  int port_ = 0;
  std::mutex mutex_;
  std::unique_ptr<store::StoreServer> server_;  // rank 0 only
  std::unique_ptr<store::StoreClient> store_;
  std::set<int> published_lost_;
};

// The IPv4 address to listen on: the one of `ifname` if given, otherwise the local address of the
// route towards `master_addr`. Throws Error(Init) naming the interface or host at fault.
std::string choose_listen_host(const std::string& master_addr, const std::string& ifname);

}  // namespace ferry::rpc
