// A training job of separate processes, started one by one as a user starts them on separate
// hosts: a ferry-master and its ferry-workers on 127.0.0.1, one intra-op thread each. For the
// cluster tests that kill, probe or wait on those processes.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ferry/core/local_world.h"
#include "tests/support/cluster.h"
#include "tests/support/temp_dir.h"
#include "tests/support/time_scale.h"

namespace ferry::testing {

// How long a training job, or its way to a checkpoint, may take.
const auto kJobTime = ferry::testing::scaled(std::chrono::seconds(120));

// A master and three workers (or more), started one by one as a user starts them on separate
// hosts.
struct World {
  std::string dir;
  std::unique_ptr<Process> master;
  std::vector<std::unique_ptr<Process>> workers;

  // `extra_env` is added to every process's environment.
  World(const std::string& name, const std::string& train_args, int worker_count = 3,
        const std::map<std::string, std::string>& extra_env = {}) {
    dir = ferry::testing::process_temp_dir().file("job-" + name);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    // The master's store takes its port from the system and writes it where the workers read it.
    auto env = [&](int rank) {
      auto vars = ferry::core::loopback_world_env(rank, worker_count + 1, 0, dir + "/port");
      vars["OMP_NUM_THREADS"] = "1";
      for (const auto& [key, value] : extra_env) vars[key] = value;
      return vars;
    };
    // Through sh only to keep the master's output; exec leaves the master as the process.
    master = std::make_unique<Process>(
        "/bin/sh",
        std::vector<std::string>{"-c", std::string("exec ") + FERRY_MASTER + " train " +
                                           train_args + " > " + dir + "/master.log 2>&1"},
        env(0));
    for (int rank = 1; rank <= worker_count; ++rank) {
      workers.push_back(std::make_unique<Process>(ferry::testing::worker_binary(),
                                                  std::vector<std::string>{}, env(rank)));
    }
  }
  ~World() { std::filesystem::remove_all(dir); }
  std::string log() const { return read_file(dir + "/master.log"); }
};

}  // namespace ferry::testing
