// One connection to rank 0's rendezvous store (rpc/store_server.h), as a c10d::Store, so that
// Gloo groups form through it as the rendezvous does. It proves the cluster secret at its
// handshake and checks the server's proof in return, so it never takes addresses from a store
// that is not the world's. Resource type.
//
// Thread rules: any thread; calls are serialised, since a connection carries one request at a
// time.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "rpc/store_protocol.h"

namespace ferry::rpc::store {

struct ClientSettings {
  std::string host;  // rank 0's address (MASTER_ADDR)
  int port = 0;
  int rank = -1;     // this process's rank, proved with the secret
  std::string name;  // how the server's log names this client
  std::string secret;
  std::chrono::milliseconds timeout{30000};  // of a get or a wait that names no timeout
};

// A store's values are bytes; Ferry's are text.
inline std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string text_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

class StoreClient : public c10d::Store {
 public:
  // Connects and passes the handshake before `deadline`, trying again while nothing listens
  // yet. Throws Error(Init) saying why it could not.
  StoreClient(ClientSettings settings, Clock::time_point deadline);
  ~StoreClient() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  // A second connection with the same settings (LibTorch 2.x asks stores for one).
  c10::intrusive_ptr<c10d::Store> clone();

 private:
  void connect(Clock::time_point deadline);
  void handshake(Clock::time_point deadline);
  Reply call(const Request& request);
  std::chrono::milliseconds wait_limit(std::chrono::milliseconds timeout) const;

  ClientSettings settings_;
  std::string server_;  // "the rendezvous store at host:port", for messages
  std::mutex mutex_;
  int fd_ = -1;
};

}  // namespace ferry::rpc::store
