// Which device a worker computes on: `--device auto` gives each worker of a node its own GPU by
// its local rank, as the launcher numbered the processes of that node (torchrun's LOCAL_RANK,
// srun's SLURM_LOCALID, mpirun's OMPI_COMM_WORLD_LOCAL_RANK), among the CUDA devices this
// process sees (CUDA_VISIBLE_DEVICES numbers them from 0).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace ferry::core {

struct DeviceChoice {
  std::string device;  // "cpu" or "cuda:N", as c10::Device parses it
  std::string reason;  // "LOCAL_RANK=5 mod 4 CUDA devices", for the worker's log
};

// `requested` resolved, with `visible` CUDA devices (what the CUDA runtime counts, so already
// within CUDA_VISIBLE_DEVICES), the local rank being the first of the launchers' variables set
// (also MPICH's MPI_LOCALRANKID):
//   "auto"   cuda:(local rank mod visible), or the CPU when no CUDA device is visible;
//   "cuda"   the same, but no visible device is an error;
//   "cuda:N" that device, an error when N is not below `visible`;
//   "cpu"    the CPU.
// Errors are std::invalid_argument saying what was asked, what is visible and, when it is set,
// CUDA_VISIBLE_DEVICES.
DeviceChoice choose_device(const std::string& requested,
                           const std::map<std::string, std::string>& env, std::int64_t visible);

}  // namespace ferry::core
