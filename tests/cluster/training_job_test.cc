// The binaries a user runs: ferry-launch starting a world of ferry-master processes that train
// the U-Net on the synthetic set or a folder of images, ferry-launch's handling of a rank that
// dies, and ferry-master describe.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <string>

#include "tests/support/sanitizer_allowance.h"

namespace {

struct CommandResult {
  int status = -1;
  std::string output;
};

// Runs a shell command (its own bound: `timeout`) and returns its exit status and output.
CommandResult run(const std::string& command) {
  CommandResult result;
  int limit_s = 240 * ferry::testing::kSanitizerSlowdown;
  FILE* pipe = popen(("timeout " + std::to_string(limit_s) + " " + command + " 2>&1").c_str(), "r");
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
                        " --batch-size 8 --optimizer adam --lr 0.003 --metrics-file " +
                        metrics);
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

// A folder of red squares on noise with their masks, as a user's data set would be laid out.
std::string write_folder_data_set(int count) {
  std::string dir = "/tmp/ferry-folder-job-" + std::to_string(getpid());
  std::filesystem::create_directories(dir + "/images");
  std::filesystem::create_directories(dir + "/masks");
  cv::RNG rng(7);
  for (int i = 0; i < count; ++i) {
    cv::Mat image(48, 48, CV_8UC3), mask(48, 48, CV_8UC1, cv::Scalar(0));
    rng.fill(image, cv::RNG::UNIFORM, 0, 128);
    cv::Rect square(rng.uniform(0, 24), rng.uniform(0, 24), 20, 20);
    image(square).setTo(cv::Scalar(0, 0, 255));
    mask(square).setTo(255);
    std::string name = "sample" + std::to_string(i);
    cv::imwrite(dir + "/images/" + name + (i % 2 ? ".jpg" : ".png"), image);
    cv::imwrite(dir + "/masks/" + name + ".png", mask);
  }
  return dir;
}

TEST(TrainingJob, TrainsOnAFolderAndStartsFromSavedWeights) {
  std::string data = write_folder_data_set(16);
  std::string checkpoints = data + "-checkpoints";
  std::string common = std::string(FERRY_LAUNCH) + " --nproc 2 -- " + FERRY_MASTER +
                       " train --model unet-resnet18 --data " + data +
                       " --crop --image-size 32 --epochs 1 --batch-size 4";
  CommandResult first = run(common + " --checkpoint-dir " + checkpoints);
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_TRUE(contains(first.output, "data: 16 image/mask pairs from " + data)) << first.output;
  EXPECT_TRUE(contains(first.output, "epoch 1/1: train loss")) << first.output;

  // A stage's checkpoint file is a state dict of the encoder alone, as a torchvision file is.
  std::ifstream latest(checkpoints + "/LATEST");
  std::string folder;
  latest >> folder;
  std::string encoder = checkpoints + "/" + folder + "/encoder.pt";
  CommandResult second = run(common + " --weights " + encoder);
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_TRUE(contains(second.output, "weights loaded from " + encoder)) << second.output;

  // A file that is not there stops the job before it trains, naming the file.
  CommandResult missing = run(common + " --weights " + data + "/nothing.pt");
  EXPECT_NE(missing.status, 0);
  EXPECT_TRUE(
      contains(missing.output, "weights file \"" + data + "/nothing.pt\": cannot be opened"))
      << missing.output;

  // A broken image fails the epoch with the file's name.
  std::ofstream(data + "/images/sample3.jpg", std::ios::trunc) << "not a JPEG";
  CommandResult broken = run(common);
  EXPECT_NE(broken.status, 0);
  EXPECT_TRUE(contains(broken.output, "cannot read \"" + data + "/images/sample3.jpg\""))
      << broken.output;
  std::filesystem::remove_all(data);
  std::filesystem::remove_all(checkpoints);
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

TEST(TrainingJob, PipelinedJobLearnsAndWritesATrace) {
  std::string base = "/tmp/ferry-pipelined-" + std::to_string(getpid());
  CommandResult r = run(std::string(FERRY_LAUNCH) + " --nproc 4 -- " + FERRY_MASTER +
                        " train --model unet-resnet18 --image-size 64 --samples 200 --epochs 2"
                        " --batch-size 8 --optimizer adam --lr 0.003 --pipeline 1f1b"
                        " --microbatches 4 --checkpoint-activations --trace " +
                        base + ".trace.json --metrics-file " + base + ".json");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "pipelined steps: 1f1b, 4 micro-batches of 2 images, "
                       "activations recomputed in backward"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "stage 0: unet.encoder on worker1")) << r.output;
  EXPECT_TRUE(contains(r.output, "ideal (p - 1) / (M + p - 1) = 33% (p = 3, M = 4)")) << r.output;
  EXPECT_TRUE(contains(r.output, "most activations held at once: encoder")) << r.output;
  auto metrics = nlohmann::json::parse(std::ifstream(base + ".json"));
  EXPECT_EQ(metrics["pipeline"]["schedule"], "1f1b");
  auto epochs = metrics["epochs"];
  EXPECT_LT(epochs.back()["train_loss"].get<double>(), epochs.front()["train_loss"].get<double>())
      << r.output;
  auto trace = nlohmann::json::parse(std::ifstream(base + ".trace.json"));
  int stage_tracks = 0, backwards = 0;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] == "M" && event["name"] == "thread_name" &&
        event["args"]["name"].get<std::string>().rfind("stage ", 0) == 0 &&
        !contains(event["args"]["name"].get<std::string>(), "receives")) {
      ++stage_tracks;
    }
    if (event["ph"] == "X" && event["cat"] == "backward") ++backwards;
  }
  EXPECT_EQ(stage_tracks, 3);
  // 160 training images: 20 steps of 4 micro-batches an epoch, each through 3 stages.
  EXPECT_EQ(backwards, 2 * 20 * 4 * 3);
  std::remove((base + ".json").c_str());
  std::remove((base + ".trace.json").c_str());
}

TEST(TrainingJob, BadPipelineSettingsAreClearErrors) {
  std::string job = std::string(FERRY_LAUNCH) + " --nproc 1 -- " + FERRY_MASTER +
                    " train --image-size 32 --samples 40 --epochs 1 --batch-size 4"
                    " --model unet-resnet18";
  CommandResult r = run(job + " --pipeline zigzag");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output,
                       "--pipeline: unknown pipeline schedule \"zigzag\" (known: "
                       "gpipe, 1f1b)"))
      << r.output;
  r = run(job + " --microbatches 8");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "--microbatches 8 is more than the 4 images of a batch"))
      << r.output;
  r = run(job + " --pipeline gpipe --via-master");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "--via-master is the naive split; it cannot be pipelined"))
      << r.output;
}

TEST(TrainingJob, UnknownModelIsAClearError) {
  CommandResult r = run(std::string(FERRY_MASTER) + " describe --model unet-resnet42");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "no ResNet of depth 42")) << r.output;
}

}  // namespace
