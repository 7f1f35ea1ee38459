// The GPU recipes of docs/running.md, read as srun, torchrun and mpirun set their variables: each
// task's rank, world and master (rpc::resolve_options) and the GPU its worker takes
// (core::choose_device with --device auto).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "ferry/core/device_choice.h"
#include "ferry/rpc/options.h"

namespace ferry::rpc {
namespace {

using Env = std::map<std::string, std::string>;

struct Task {
  int rank;
  std::string name;
  std::string master;
  std::string device;
};

Task task_of(const Env& env, int visible) {
  const Options o = resolve_options({}, env);
  return {o.rank, o.name, o.master_addr, core::choose_device("auto", env, visible).device};
}

// One node, `--ntasks=5 --gres=gpu:4`: srun gives every task the node's four GPUs. The master
// (task 0) builds no stage; the four workers take one GPU each.
TEST(GpuRecipe, OneSlurmNodeOfFourGpusAMasterAndFourWorkers) {
  std::vector<std::string> devices;
  for (int task = 0; task < 5; ++task) {
    const Task t = task_of({{"SLURM_PROCID", std::to_string(task)},
                            {"SLURM_LOCALID", std::to_string(task)},
                            {"SLURM_NTASKS", "5"},
                            {"SLURM_NODELIST", "gpu17"},
                            {"SLURM_JOB_ID", "4242"},
                            {"CUDA_VISIBLE_DEVICES", "0,1,2,3"}},
                           4);
    EXPECT_EQ(t.rank, task);
    EXPECT_EQ(t.master, "gpu17");
    if (task > 0) devices.push_back(t.device);
  }
  EXPECT_EQ(devices, (std::vector<std::string>{"cuda:1", "cuda:2", "cuda:3", "cuda:0"}));
}

// Two nodes, `--ntasks-per-node=4 --gres=gpu:4`: the second node's tasks count their local ids
// from 0 again, so its four workers take its four GPUs; the master is on the first node.
TEST(GpuRecipe, TwoSlurmNodesNumberTheirGpusEachFromZero) {
  for (int task = 0; task < 8; ++task) {
    const Task t = task_of({{"SLURM_PROCID", std::to_string(task)},
                            {"SLURM_LOCALID", std::to_string(task % 4)},
                            {"SLURM_NODEID", std::to_string(task / 4)},
                            {"SLURM_NTASKS", "8"},
                            {"SLURM_NODELIST", "gpu[17-18]"},
                            {"SLURM_JOB_ID", "4243"}},
                           4);
    EXPECT_EQ(t.rank, task);
    EXPECT_EQ(t.name, "worker" + std::to_string(task));
    EXPECT_EQ(t.master, "gpu17");
    EXPECT_EQ(t.device, "cuda:" + std::to_string(task % 4));
  }
}

// `torchrun --nproc-per-node=5 --no-python ferry-master train ...`, and the same under mpirun
// (`mpirun -x MASTER_ADDR -x MASTER_PORT`).
TEST(GpuRecipe, TorchrunAndMpirunGiveTheSameGpus) {
  for (int rank = 1; rank < 5; ++rank) {
    const Task torchrun = task_of({{"RANK", std::to_string(rank)},
                                   {"LOCAL_RANK", std::to_string(rank)},
                                   {"WORLD_SIZE", "5"},
                                   {"LOCAL_WORLD_SIZE", "5"},
                                   {"MASTER_ADDR", "127.0.0.1"},
                                   {"MASTER_PORT", "29500"}},
                                  4);
    const Task mpirun = task_of({{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank)},
                                 {"OMPI_COMM_WORLD_SIZE", "5"},
                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "5"},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", "29500"}},
                                4);
    EXPECT_EQ(torchrun.rank, rank);
    EXPECT_EQ(mpirun.rank, rank);
    EXPECT_EQ(torchrun.device, "cuda:" + std::to_string(rank % 4));
    EXPECT_EQ(mpirun.device, torchrun.device);
  }
}

}  // namespace
}  // namespace ferry::rpc
