// Faults in a training world of separate processes (a ferry-master and three ferry-workers, as on
// separate hosts): a worker killed mid-training fails the job naming the worker and its stage and
// leaves the last checkpoint whole, from which training resumes; a killed master leaves no worker
// behind. Every wait is bounded.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/support/cluster.h"

namespace {

using Clock = std::chrono::steady_clock;
using ferry::testing::Process;
namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Waits up to `limit` for `done`; false if it never held.
template <typename F>
bool wait_until(F done, std::chrono::seconds limit) {
  auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

// A master and three workers, started one by one as a user starts them on separate hosts.
struct World {
  std::string dir;
  std::unique_ptr<Process> master;
  std::vector<std::unique_ptr<Process>> workers;

  World(const std::string& name, const std::string& train_args) {
    dir = "/tmp/ferry-fault-" + name + "-" + std::to_string(getpid());
    fs::remove_all(dir);
    fs::create_directories(dir);
    int port = ferry::testing::free_port();
    auto env = [&](int rank) {
      return std::map<std::string, std::string>{{"RANK", std::to_string(rank)},
                                                {"WORLD_SIZE", "4"},
                                                {"MASTER_ADDR", "127.0.0.1"},
                                                {"MASTER_PORT", std::to_string(port)},
                                                {"OMP_NUM_THREADS", "1"}};
    };
    // Through sh only to keep the master's output; exec leaves the master as the process.
    master = std::make_unique<Process>(
        "/bin/sh",
        std::vector<std::string>{"-c", std::string("exec ") + FERRY_MASTER + " train " +
                                           train_args + " > " + dir + "/master.log 2>&1"},
        env(0));
    for (int rank = 1; rank <= 3; ++rank) {
      workers.push_back(std::make_unique<Process>(ferry::testing::worker_binary(),
                                                  std::vector<std::string>{}, env(rank)));
    }
  }
  ~World() { fs::remove_all(dir); }
  std::string log() const { return read_file(dir + "/master.log"); }
};

const char* kJob =
    "--model unet-resnet18 --image-size 32 --samples 200 --batch-size 8 --optimizer adam";

TEST(Faults, AKilledWorkerFailsTheJobNamingItsStageAndTheCheckpointResumes) {
  World world("kill-worker", std::string(kJob) + " --epochs 50 --checkpoint-dir " +
                                 "/tmp/ferry-fault-ckpt-" + std::to_string(getpid()));
  std::string ckpt = "/tmp/ferry-fault-ckpt-" + std::to_string(getpid());
  ASSERT_TRUE(wait_until([&] { return fs::exists(ckpt + "/LATEST"); }, std::chrono::seconds(90)))
      << world.log();
  world.workers[1]->kill(SIGKILL);  // worker2, the decoder's
  auto killed = Clock::now();
  std::optional<int> status = world.master->wait(std::chrono::seconds(120));
  double detected = std::chrono::duration<double>(Clock::now() - killed).count();
  ASSERT_TRUE(status.has_value()) << world.log();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << world.log();
  std::string log = world.log();
  EXPECT_NE(log.find("worker \"worker2\" held stage decoder"), std::string::npos) << log;
  EXPECT_NE(log.find("the last checkpoint in " + ckpt + " is intact"), std::string::npos) << log;
  std::cout << "the master failed " << detected << " s after worker2 was killed\n";
  // Well within twice the RPC timeout (60 s): a dead peer's connection closes at once.
  EXPECT_LT(detected, 10.0);
  for (auto& w : world.workers) w->wait(std::chrono::seconds(10));

  // The checkpoint the killed run left is whole (LATEST is "ckpt-<epoch>" of a folder with its
  // manifest), and a new world resumes from it for one more epoch.
  std::string latest = read_file(ckpt + "/LATEST");
  ASSERT_EQ(latest.rfind("ckpt-", 0), 0u) << latest;
  ASSERT_TRUE(fs::exists(ckpt + "/" + latest + "/manifest.json")) << latest;
  int epoch = std::stoi(latest.substr(5));
  World resumed("resume", std::string(kJob) + " --epochs " + std::to_string(epoch + 1) +
                              " --resume --checkpoint-dir " + ckpt);
  status = resumed.master->wait(std::chrono::seconds(120));
  ASSERT_TRUE(status.has_value()) << resumed.log();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << resumed.log();
  EXPECT_NE(resumed.log().find("resumed from " + ckpt), std::string::npos) << resumed.log();
  fs::remove_all(ckpt);
}

TEST(Faults, WorkersExitByThemselvesWhenTheMasterIsKilled) {
  World world("kill-master", std::string(kJob) + " --epochs 50");
  ASSERT_TRUE(wait_until([&] { return world.log().find("epoch 1/50") != std::string::npos; },
                         std::chrono::seconds(90)))
      << world.log();
  world.master->kill(SIGKILL);
  auto killed = Clock::now();
  for (size_t i = 0; i < world.workers.size(); ++i) {
    std::optional<int> status = world.workers[i]->wait(std::chrono::seconds(10));
    EXPECT_TRUE(status.has_value()) << "worker" << i + 1 << " still running 10 s after the master";
  }
  double gone = std::chrono::duration<double>(Clock::now() - killed).count();
  std::cout << "every worker exited " << gone << " s after the master was killed\n";
  EXPECT_LT(gone, 5.0);
}

}  // namespace
