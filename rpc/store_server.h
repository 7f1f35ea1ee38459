// Rank 0's rendezvous store: a StoreTable served over TCP to the clients that pass Ferry's
// handshake (rpc/store_protocol.h). With a cluster secret, a client that does not prove it is
// refused before it can read or write a key, so the addresses that agents and Gloo groups
// publish here come from members only. Resource type, owned by rank 0's Rendezvous.
//
// Thread rules: one accepting thread, and one thread per connection that applies its requests
// in turn (a Get that waits holds up only its own connection). Construction and destruction on
// the owner's thread; the destructor closes every connection and joins every thread.
#pragma once

#include <atomic>
#include <chrono>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "rpc/store_table.h"

namespace ferry::rpc::store {

struct ServerSettings {
  int port = 0;        // 0: one the system picks (see port())
  std::string secret;  // empty: every client that speaks the protocol is served
  int world_size = 1;  // a hello's rank must be below it
  std::chrono::milliseconds handshake_timeout{10000};
};

class StoreServer {
 public:
  // Listens on every IPv4 interface. Throws Error(Init) saying why it cannot.
  explicit StoreServer(ServerSettings settings);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // Why the last client claiming `rank` was refused ("from ADDRESS: REASON"), or empty: what
  // rank 0 adds when that rank never joins. Any thread.
  std::string refusal_of(int rank);

 private:
  struct Client;

  void accept_loop();
  void serve(Client& client);
  bool admit(Client& client);
  void reap_finished();

  ServerSettings settings_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: a byte written wakes the accepting thread to stop
  int port_ = 0;
  StoreTable table_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> unadmitted_{0};
  std::mutex refusals_mutex_;
  std::map<int, std::string> refusals_;
  std::mutex clients_mutex_;
  std::list<std::unique_ptr<Client>> clients_;
  std::thread acceptor_;
};

}  // namespace ferry::rpc::store
