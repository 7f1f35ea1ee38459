// The other processes a benchmark starts: spawned with this process's environment plus a world
// of its own, and reaped (killed if they outlive a grace period) at the end.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace ferry::bench {

// Starts `binary` with `args`; `env` is added to this process's environment; with `output`, its
// stdout and stderr are appended to that file instead of this process's. Throws
// std::runtime_error naming the binary if it cannot start.
pid_t spawn_process(const std::string& binary, const std::vector<std::string>& args,
                    const std::map<std::string, std::string>& env, const std::string& output = "");
// Starts `binary` as spawn_process does and waits for it; returns its exit status (-1 if a
// signal ended it).
int run_process(const std::string& binary, const std::vector<std::string>& args,
                const std::map<std::string, std::string>& env, const std::string& output = "");
// Waits up to `grace` for `pid` to exit, then kills it.
void reap_process(pid_t pid, std::chrono::milliseconds grace = std::chrono::seconds(10));
// Joins that world as its rank 0, named `name` (rpc::init), its store on a port of the system's
// choosing, written to `port_file` for the other ranks (core::loopback_world_env with port 0).
void init_loopback_master(const std::string& name, int world_size, const std::string& port_file);

}  // namespace ferry::bench
