// Settings of one agent (value type). Fields left unset are taken from the environment by
// resolve_options(): torchrun's RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, Slurm's
// SLURM_PROCID / SLURM_NTASKS / SLURM_NODELIST, or Open MPI's OMPI_COMM_WORLD_RANK / _SIZE.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ferry::rpc {

struct Options {
  std::string name;         // unique worker name; default "worker<rank>"
  int rank = -1;            // -1: from the environment
  int world_size = -1;      // -1: from the environment
  std::string master_addr;  // host of rank 0's rendezvous store; empty: from the environment
  int master_port = -1;     // -1: from the environment; 0 on rank 0 picks a free port
  // With master port 0: rank 0's store takes a port from the system when it opens and writes
  // it here; every other rank waits for the file (within init_timeout) and reads it. A file that
  // does not exist yet, one per world. Empty: FERRY_MASTER_PORT_FILE; set there without a
  // MASTER_PORT, the port is 0.
  std::string master_port_file;
  std::string ifname;  // interface to listen on; empty: FERRY_IFNAME, else the route to master
  // The cluster secret every connection proves at its handshake (see rpc/auth.h). Empty: read
  // from `secret_file`, else FERRY_SECRET, else the file FERRY_SECRET_FILE names; still empty:
  // the cluster is open to anyone who can reach its ports.
  std::string secret;
  std::string secret_file;
  int num_threads = 4;                                 // pool threads that run user functions
  std::chrono::milliseconds rpc_timeout{60000};        // default deadline of a call
  std::chrono::milliseconds init_timeout{30000};       // bound on the whole rendezvous
  std::chrono::milliseconds shutdown_timeout{10000};   // bound on the graceful shutdown barrier
  std::chrono::milliseconds handshake_timeout{10000};  // an accepted connection's hello, at most
  std::uint64_t max_frame_bytes = std::uint64_t{4} << 30;  // envelope plus tensor bytes
  int max_nesting_depth = 64;                              // of containers inside a value
  // Bytes queued to one peer (frames hold their tensors until written) before a sender waits
  // for the socket to take them, up to its call's deadline: a slow reader gets backpressure.
  std::uint64_t max_queued_bytes = std::uint64_t{256} << 20;
};

// Rank `rank`, named `name`, of a world of `world_size` on this machine whose rank 0 keeps the
// rendezvous on 127.0.0.1:`port`: what tests and benchmarks start their worlds with.
Options loopback_options(const std::string& name, int rank, int world_size, int port);

// Fills every unset field of `options` from `env` (normally the process environment) and checks
// the result; throws Error(Init) naming the missing or contradictory setting.
Options resolve_options(Options options, const std::map<std::string, std::string>& env);
Options resolve_options(Options options);

// Whether `env` (normally the process environment) holds a world's size, as a launcher sets it:
// whether this process is one rank of a world rather than a program run on its own.
bool world_in_environment(const std::map<std::string, std::string>& env);
bool world_in_environment();

}  // namespace ferry::rpc
