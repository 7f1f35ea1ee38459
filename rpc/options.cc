#include "ferry/rpc/options.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "ferry/core/environment.h"
#include "ferry/core/files.h"
#include "ferry/core/log.h"
#include "ferry/rpc/error.h"
#include "rpc/slurm_nodelist.h"

namespace ferry::rpc {
namespace {

const std::string* find(const std::map<std::string, std::string>& env, const char* key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// Where launchers put the size of the world: torchrun, srun, mpirun, other PMI launchers.
const std::vector<std::string> kWorldSizeVariables = {"WORLD_SIZE", "SLURM_NTASKS",
                                                      "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};

// `text`, the value of `name`, as an int of at least `min`; Error(Init) naming it otherwise.
int int_of(const std::string& name, const std::string& text, std::int64_t min) {
  try {
    return static_cast<int>(
        core::parse_whole_number(name, text, min, "", std::numeric_limits<int>::max()));
  } catch (const std::invalid_argument& e) {
    throw Error(ErrorKind::Init, e.what());
  }
}

// The first environment variable of `keys` that is set, parsed as an int of at least `min`.
bool int_from_env(const std::map<std::string, std::string>& env,
                  const std::vector<std::string>& keys, std::int64_t min, int* out) {
  for (const std::string& key : keys) {
    if (const std::string* value = find(env, key.c_str())) {
      *out = int_of(key, *value, min);
      return true;
    }
  }
  return false;
}

// The secret in `path`, less one trailing newline (as `echo` or an editor leaves it).
std::string read_secret_file(const std::string& path, const char* what) {
  std::string secret;
  try {
    secret = core::read_whole_file(path);
  } catch (const std::runtime_error& e) {
    throw Error(ErrorKind::Init, fmt::format("{}: {}", what, e.what()));
  }
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  if (secret.empty()) throw Error(ErrorKind::Init, fmt::format("{} {} is empty", what, path));
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    log::warn("{} {} is readable by other users; chmod 600 it", what, path);
  }
  return secret;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // Hosts are separated by commas outside brackets; a bracket holds ranges of suffixes.
  size_t end = 0;
  int depth = 0;
  while (end < nodelist.size() && !(nodelist[end] == ',' && depth == 0)) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    ++end;
  }
  std::string first = nodelist.substr(0, end);
  size_t open = first.find('[');
  if (open == std::string::npos) return first;
  std::string prefix = first.substr(0, open);
  std::string inside = first.substr(open + 1, first.find(']', open) - open - 1);
  std::string suffix = inside.substr(0, inside.find_first_of(",-"));
  return prefix + suffix;
}

Options loopback_options(const std::string& name, int rank, int world_size, int port) {
  Options options;
  options.name = name;
  options.rank = rank;
  options.world_size = world_size;
  options.master_addr = "127.0.0.1";
  options.master_port = port;
  return options;
}

namespace {

// The fields a launcher's variables give, where `options` leaves them unset.
void fill_from_environment(Options& options, const std::map<std::string, std::string>& env) {
  if (options.rank < 0) {
    int_from_env(env, {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}, 0,
                 &options.rank);
  }
  if (options.world_size < 0) {
    int_from_env(env, kWorldSizeVariables, 1, &options.world_size);
  }
  if (options.master_addr.empty()) {
    if (const std::string* addr = find(env, "MASTER_ADDR")) {
      options.master_addr = *addr;
    } else if (const std::string* nodes = find(env, "SLURM_NODELIST")) {
      options.master_addr = first_slurm_host(*nodes);
    } else if (const std::string* nodes = find(env, "SLURM_JOB_NODELIST")) {
      options.master_addr = first_slurm_host(*nodes);
    } else if (options.world_size == 1 || options.rank == 0) {
      options.master_addr = "127.0.0.1";
    } else if (const std::string* local = find(env, "OMPI_COMM_WORLD_LOCAL_SIZE")) {
      // mpirun on one host: every rank is local, so the master is too.
      if (int_of("OMPI_COMM_WORLD_LOCAL_SIZE", *local, 1) == options.world_size) {
        options.master_addr = "127.0.0.1";
      }
    }
  }
  if (options.master_port_file.empty()) {
    if (const std::string* file = find(env, "FERRY_MASTER_PORT_FILE")) {
      options.master_port_file = *file;
    }
  }
  if (options.master_port < 0 && !int_from_env(env, {"MASTER_PORT"}, 0, &options.master_port)) {
    if (!options.master_port_file.empty()) {
      options.master_port = 0;  // rank 0 publishes the port it gets
    } else {
      // Slurm and Open MPI give no port: derive one from the job id so every task of a job
      // agrees.
      for (const char* key : {"SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid"}) {
        if (const std::string* job = find(env, key)) {
          options.master_port =
              20000 + static_cast<int>(std::strtoul(job->c_str(), nullptr, 10) % 20000);
          break;
        }
      }
    }
  }
  if (options.ifname.empty()) {
    if (const std::string* ifname = find(env, "FERRY_IFNAME")) options.ifname = *ifname;
  }
  if (options.secret.empty()) {
    if (!options.secret_file.empty()) {
      options.secret = read_secret_file(options.secret_file, "secret file");
    } else if (const std::string* secret = find(env, "FERRY_SECRET")) {
      options.secret = *secret;
    } else if (const std::string* path = find(env, "FERRY_SECRET_FILE")) {
      options.secret = read_secret_file(*path, "FERRY_SECRET_FILE");
    }
  }
}

// Throws Error(Init) naming the first setting that is missing or contradicts another.
void check_resolved(Options& options) {
  if (options.rank < 0) {
    throw Error(ErrorKind::Init,
                "rank is not set: pass Options::rank or set RANK (torchrun), SLURM_PROCID (srun) "
                "or OMPI_COMM_WORLD_RANK (mpirun)");
  }
  if (options.world_size <= 0) {
    throw Error(ErrorKind::Init,
                "world size is not set: pass Options::world_size or set WORLD_SIZE, SLURM_NTASKS "
                "or OMPI_COMM_WORLD_SIZE");
  }
  if (options.rank >= options.world_size) {
    throw Error(ErrorKind::Init, fmt::format("rank {} is out of range for a world of {} workers",
                                             options.rank, options.world_size));
  }
  if (options.master_addr.empty()) {
    throw Error(ErrorKind::Init, fmt::format("rank {}: master address is not set: pass "
                                             "Options::master_addr or set MASTER_ADDR",
                                             options.rank));
  }
  if (options.master_port < 0 || options.master_port > 65535 ||
      (options.master_port == 0 && options.rank != 0 && options.master_port_file.empty())) {
    throw Error(ErrorKind::Init,
                fmt::format("rank {}: master port {} is not usable: pass Options::master_port or "
                            "set MASTER_PORT (0 lets rank 0 pick a free port, which the other "
                            "ranks read from FERRY_MASTER_PORT_FILE)",
                            options.rank, options.master_port));
  }
  if (options.name.empty()) options.name = fmt::format("worker{}", options.rank);
  if (options.num_threads < 1) {
    throw Error(ErrorKind::Init,
                fmt::format("num_threads must be at least 1, got {}", options.num_threads));
  }
}

}  // namespace

Options resolve_options(Options options, const std::map<std::string, std::string>& env) {
  fill_from_environment(options, env);
  check_resolved(options);
  return options;
}

Options resolve_options(Options options) {
  return resolve_options(std::move(options), core::process_environment());
}

bool world_in_environment(const std::map<std::string, std::string>& env) {
  int size = 0;
  return int_from_env(env, kWorldSizeVariables, 1, &size);
}

bool world_in_environment() { return world_in_environment(core::process_environment()); }

}  // namespace ferry::rpc
