// What starting several processes of one world on one machine needs, for ferry-launch, the
// benchmarks and the tests: a port or port file for their rendezvous, and an OpenMP spin count that
// lets them share the cores.
#pragma once

#include <map>
#include <string>

namespace ferry::core {

// The variables that make a process rank `rank` of a world of `world_size` on loopback whose
// rank 0 keeps the rendezvous on `port`, as torchrun sets them. With `port_file` (and port 0),
// rank 0 takes its port from the system when its store opens and writes it there, where the
// other ranks read it (FERRY_MASTER_PORT_FILE, rpc::Options::master_port_file).
std::map<std::string, std::string> loopback_world_env(int rank, int world_size, int port,
                                                      const std::string& port_file = "");

// Where rank 0 of a local world writes the port its store took from the system, for the other
// ranks to read (loopback_world_env's `port_file` with port 0): no port is picked, released and
// handed out, for another process to take in between. A file in a folder of its own under
// $TMPDIR (else /tmp), removed with what is in it when this is destroyed. Resource type.
class PortFile {
 public:
  // Throws std::runtime_error naming the folder if it cannot be made.
  PortFile();
  ~PortFile();
  PortFile(const PortFile&) = delete;
  PortFile& operator=(const PortFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string folder_, path_;
};

// A TCP port that is free on `host` right now (bound, then released): what a launcher hands out
// as MASTER_PORT. Throws std::runtime_error if none can be had.
int pick_free_port(const std::string& host = "127.0.0.1");

// GOMP_SPINCOUNT for processes that share one machine's cores, as the stages of a split on one
// machine do; ferry-launch and the benchmarks give it to the processes they start unless it is
// set already. An idle OpenMP thread spins before it sleeps; with libgomp's default (300 000
// spins) the threads of the stage that just finished keep the cores busy while the next stage
// starts. 10 000 spins is well under a millisecond (docs/benchmarks.md has the measurement).
inline constexpr char kSharedMachineSpinCount[] = "10000";

}  // namespace ferry::core
