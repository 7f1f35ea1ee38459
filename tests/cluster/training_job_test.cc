// The binaries a user runs: ferry-launch starting a world of ferry-master processes that train
// the U-Net, ferry-launch's handling of a rank that dies, and ferry-master describe.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct CommandResult {
  int status = -1;
  std::string output;
};

// Runs a shell command (its own bound: `timeout`) and returns its exit status and output.
CommandResult run(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen(("timeout 240 " + command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), buf.size(), pipe)) result.output += buf.data();
  int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(TrainingJob, FourProcessesLearnTheSyntheticSet) {
  std::string metrics = "/tmp/ferry-train-test-" + std::to_string(getpid()) + ".json";
  CommandResult r = run(std::string(FERRY_LAUNCH) + " --nproc 4 -- " + FERRY_MASTER +
              " train --model unet-resnet18 --image-size 64 --samples 320 --epochs 3"
              " --batch-size 8 --optimizer adam --lr 0.003 --metrics-file " + metrics);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 0] epoch 3/3")) << r.output;
  EXPECT_TRUE(contains(r.output, "encoder  worker1")) << r.output;
  std::ifstream in(metrics);
  auto epochs = nlohmann::json::parse(in)["epochs"];
  double best_iou = 0;
  for (const auto& epoch : epochs) best_iou = std::max(best_iou, epoch["val_iou"].get<double>());
  // Three short epochs reach a best validation IoU of 0.57-0.71 here (batch norm's running
  // statistics make single epochs jumpy); predicting all foreground gives about 0.25.
  EXPECT_GT(best_iou, 0.45) << r.output;
  EXPECT_LT(epochs.back()["train_loss"].get<double>(),
            0.6 * epochs.front()["train_loss"].get<double>())
      << r.output;
  std::remove(metrics.c_str());
}

TEST(TrainingJob, LauncherStopsTheWorldWhenARankDiesAndSaysWhich) {
  auto start = std::chrono::steady_clock::now();
  CommandResult r = run(std::string(FERRY_LAUNCH) +
              " --nproc 3 -- sh -c 'echo hello from $RANK of $WORLD_SIZE; "
              "if [ $RANK = 1 ]; then sleep 1; exit 3; fi; sleep 60'");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 2] hello from 2 of 3")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1 (pid")) << r.output;
  EXPECT_TRUE(contains(r.output, "exited with status 3; stopping the others")) << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(TrainingJob, DescribeGivesEveryStageAndTheTotal) {
  CommandResult r = run(std::string(FERRY_MASTER) + " describe --model unet-resnet34 --json");
  ASSERT_EQ(r.status, 0) << r.output;
  auto json = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  EXPECT_EQ(json["total_parameters"].get<int64_t>(), 24436369);
  ASSERT_EQ(json["stages"].size(), 3u);
  EXPECT_EQ(json["stages"][0]["name"], "encoder");
  EXPECT_EQ(json["stages"][0]["parameters"].get<int64_t>(), 21284672);
  EXPECT_EQ(json["stages"][2]["output_shapes"][0], nlohmann::json({1, 1, 256, 256}));
}

TEST(TrainingJob, UnknownModelIsAClearError) {
  CommandResult r = run(std::string(FERRY_MASTER) + " describe --model unet-resnet42");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "no ResNet of depth 42")) << r.output;
}

}  // namespace
