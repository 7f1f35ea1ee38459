// A cluster of hosts on this machine (network namespaces, tests/support/netns.h): the U-Net
// trains across four hosts with the same losses as on loopback, and FERRY_IFNAME picks an
// agent's interface. Skipped where namespaces cannot be made (not root).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/cluster.h"
#include "tests/support/netns.h"
#include "tests/support/temp_dir.h"
#include "tests/support/wait.h"

namespace {

using ferry::testing::NetnsCluster;
using ferry::testing::read_file;

std::string temp(const std::string& name) {
  return ferry::testing::process_temp_dir().file("multihost-" + name);
}

const char* kHostsJob =
    " train --model unet-resnet18 --image-size 32 --samples 96 --epochs 2 --batch-size 8"
    " --optimizer adam --lr 0.003";

std::map<std::string, std::string> rank_env(int rank, int world, const std::string& master) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", master},
          {"MASTER_PORT", "29500"},
          {"OMP_NUM_THREADS", "1"}};
}

TEST(MultiHost, FourHostsTrainTheUnetWithTheLoopbackLosses) {
  if (!NetnsCluster::available()) GTEST_SKIP() << "network namespaces need root";
  // The same job on loopback first.
  std::string loopback = temp("loopback.json");
  std::string command = std::string("OMP_NUM_THREADS=1 timeout 180 ") + FERRY_LAUNCH +
                        " --nproc 4 -- " + FERRY_MASTER + kHostsJob + " --metrics-file " +
                        loopback + " > " + temp("loopback.log") + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << read_file(temp("loopback.log"));

  NetnsCluster cluster(4, {"200mbit", "20ms"});
  std::string metrics = temp("hosts.json");
  auto& master =
      cluster.run(0, std::string(FERRY_MASTER) + kHostsJob + " --metrics-file " + metrics,
                  rank_env(0, 4, cluster.address(0)), temp("master.log"));
  for (int h = 1; h < 4; ++h) {
    auto env = rank_env(h, 4, cluster.address(0));
    cluster.run(h, ferry::testing::worker_binary(), env, temp("worker" + std::to_string(h)));
  }
  std::optional<int> status = master.wait(std::chrono::seconds(180));
  ASSERT_TRUE(status.has_value()) << read_file(temp("master.log"));
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << read_file(temp("master.log"));
  for (int h = 1; h < 4; ++h) {
    // Each worker listened on its own host's address, found from the route to the master.
    EXPECT_NE(read_file(temp("worker" + std::to_string(h))).find(cluster.address(h)),
              std::string::npos)
        << read_file(temp("worker" + std::to_string(h)));
  }
  auto want = nlohmann::json::parse(std::ifstream(loopback))["epochs"];
  auto got = nlohmann::json::parse(std::ifstream(metrics))["epochs"];
  ASSERT_EQ(got.size(), want.size());
  for (size_t e = 0; e < want.size(); ++e) {
    for (const char* key : {"train_loss", "val_loss"}) {
      double a = got[e][key].get<double>(), b = want[e][key].get<double>();
      EXPECT_NEAR(a, b, 1e-5 * std::abs(b)) << key << " of epoch " << e + 1;
    }
  }
  for (const char* name : {"loopback.json", "loopback.log", "hosts.json", "master.log", "worker1",
                           "worker2", "worker3"}) {
    std::remove(temp(name).c_str());
  }
}

TEST(MultiHost, ACutLinkFailsTheJobNamingTheHostBehindIt) {
  if (!NetnsCluster::available()) GTEST_SKIP() << "network namespaces need root";
  NetnsCluster cluster(4);
  std::string job = std::string(FERRY_MASTER) +
                    " train --model unet-resnet18 --image-size 32 --samples 400 --epochs 50"
                    " --batch-size 8";
  auto& master = cluster.run(0, job, rank_env(0, 4, cluster.address(0)), temp("cut-master"));
  for (int h = 1; h < 4; ++h) {
    cluster.run(h, ferry::testing::worker_binary(), rank_env(h, 4, cluster.address(0)),
                temp("cut-worker" + std::to_string(h)));
  }
  ASSERT_TRUE(ferry::testing::wait_until(
      [&] { return read_file(temp("cut-master")).find("epoch 1/50 [####") != std::string::npos; },
      std::chrono::seconds(90), std::chrono::milliseconds(100)))
      << read_file(temp("cut-master"));
  ASSERT_EQ(std::system(("ip netns exec " + cluster.ns(2) + " ip link set eth0 down").c_str()), 0);
  auto cut = std::chrono::steady_clock::now();
  // Twice the RPC timeout (60 s) at most; keepalive and the unacknowledged-data limit find a
  // silent link much sooner.
  std::optional<int> status = master.wait(std::chrono::seconds(120));
  double detected = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  std::string log = read_file(temp("cut-master"));
  ASSERT_TRUE(status.has_value()) << log;
  EXPECT_NE(WEXITSTATUS(*status), 0) << log;
  EXPECT_NE(log.find("worker2"), std::string::npos) << log;
  std::cout << "the master failed " << detected << " s after worker2's link was cut\n";
  EXPECT_LT(detected, 30.0) << log;
  for (const char* name : {"cut-master", "cut-worker1", "cut-worker2", "cut-worker3"}) {
    std::remove(temp(name).c_str());
  }
}

TEST(MultiHost, FerryIfnamePicksTheInterfaceAndAWrongNameListsThem) {
  if (!NetnsCluster::available()) GTEST_SKIP() << "network namespaces need root";
  NetnsCluster cluster(2);
  std::string job = std::string(FERRY_MASTER) +
                    " train --model unet-resnet18 --image-size 32 --samples 40 --epochs 1"
                    " --batch-size 8";
  auto env = rank_env(1, 2, cluster.address(0));
  env["FERRY_IFNAME"] = "eth1";
  auto& master = cluster.run(0, job, rank_env(0, 2, cluster.address(0)), temp("ifname-master"));
  cluster.run(1, ferry::testing::worker_binary(), env, temp("ifname-worker"));
  std::optional<int> status = master.wait(std::chrono::seconds(120));
  ASSERT_TRUE(status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << read_file(temp("ifname-master"));
  EXPECT_NE(read_file(temp("ifname-worker")).find(cluster.second_address(1)), std::string::npos)
      << read_file(temp("ifname-worker"));

  env["FERRY_IFNAME"] = "eth7";
  auto& wrong = cluster.run(1, ferry::testing::worker_binary(), env, temp("ifname-wrong"));
  status = wrong.wait(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_NE(WEXITSTATUS(*status), 0);
  std::string log = read_file(temp("ifname-wrong"));
  EXPECT_NE(log.find("eth7"), std::string::npos) << log;
  EXPECT_NE(log.find("eth0"), std::string::npos) << log;
  EXPECT_NE(log.find("eth1"), std::string::npos) << log;
  for (const char* name : {"ifname-master", "ifname-worker", "ifname-wrong"}) {
    std::remove(temp(name).c_str());
  }
}

}  // namespace
