// The binaries a user runs: ferry-launch starting a world of ferry-master processes that train
// the U-Net on the synthetic set or a folder of images, ferry-launch's handling of a rank that
// dies, and ferry-master describe.
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <string>
#include <vector>

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
// The `inverted` samples after them (in name order: the validation share) have their masks
// inverted, so that learning the training set makes the validation metrics worse.
std::string write_folder_data_set(int count, int inverted = 0) {
  std::string dir = "/tmp/ferry-folder-job-" + std::to_string(getpid());
  std::filesystem::create_directories(dir + "/images");
  std::filesystem::create_directories(dir + "/masks");
  cv::RNG rng(7);
  for (int i = 0; i < count + inverted; ++i) {
    cv::Mat image(48, 48, CV_8UC3), mask(48, 48, CV_8UC1, cv::Scalar(0));
    rng.fill(image, cv::RNG::UNIFORM, 0, 128);
    cv::Rect square(rng.uniform(0, 24), rng.uniform(0, 24), 20, 20);
    image(square).setTo(cv::Scalar(0, 0, 255));
    mask(square).setTo(255);
    if (i >= count) cv::bitwise_not(mask, mask);
    std::string name = (i < count ? "sample" : "zz-held-out") + std::to_string(i);
    cv::imwrite(dir + "/images/" + name + (i % 2 ? ".jpg" : ".png"), image);
    cv::imwrite(dir + "/masks/" + name + ".png", mask);
  }
  return dir;
}

std::vector<char> bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

// The folder of the newest checkpoint in `dir`.
std::string latest_checkpoint(const std::string& dir) {
  std::ifstream latest(dir + "/LATEST");
  std::string folder;
  latest >> folder;
  return dir + "/" + folder;
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

  // The encoder stage's checkpoint file, its names made those of a torchvision ResNet (a stage's
  // file has the whole U-Net's names, "encoder.conv1.weight").
  auto saved = torch::pickle_load(bytes(latest_checkpoint(checkpoints) + "/encoder.pt"))
                   .to<c10::Dict<std::string, at::Tensor>>();
  c10::Dict<std::string, at::Tensor> resnet;
  for (const auto& item : saved) resnet.insert(item.key().substr(8), item.value());
  ASSERT_EQ(saved.begin()->key().substr(0, 8), "encoder.");
  std::string encoder = checkpoints + "/resnet18.pt";
  std::vector<char> written = torch::pickle_save(c10::IValue(resnet));
  std::ofstream(encoder, std::ios::binary).write(written.data(), written.size());
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
  EXPECT_TRUE(contains(r.output, "stage 0: encoder on worker1")) << r.output;
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

// --stages 4 measures every block, balances their memory over four stages before any is built,
// prints the plan that describe prints, and the job learns as the three-seam split does.
TEST(TrainingJob, FourBalancedStagesLearnAndDescribePrintsTheirPlan) {
  const std::string plan_flags =
      " --model unet-resnet18 --image-size 64 --batch-size 8 --optimizer adam --stages 4";
  CommandResult d = run(std::string(FERRY_MASTER) + " describe --json" + plan_flags);
  ASSERT_EQ(d.status, 0) << d.output;
  auto plan = nlohmann::json::parse(d.output.substr(d.output.find('{')));
  EXPECT_EQ(plan["method"], "balanced by memory");
  ASSERT_EQ(plan["stages"].size(), 4u);
  int64_t next = 0, total = 0;
  for (const auto& stage : plan["stages"]) {
    EXPECT_EQ(stage["first"].get<int64_t>(), next) << stage;
    next = stage["last"].get<int64_t>();
    total += stage["parameters"].get<int64_t>();
  }
  EXPECT_EQ(next, 15);  // ResNet-18: stem, 8 residual blocks, 5 decoder blocks, head
  EXPECT_EQ(total, plan["total_parameters"].get<int64_t>());

  std::string metrics = "/tmp/ferry-stages-test-" + std::to_string(getpid()) + ".json";
  CommandResult r =
      run(std::string(FERRY_LAUNCH) + " --nproc 5 -- " + FERRY_MASTER + " train" + plan_flags +
          " --samples 320 --epochs 3 --lr 0.003 --metrics-file " + metrics);
  ASSERT_EQ(r.status, 0) << r.output;
  for (size_t k = 0; k < 4; ++k) {
    const auto& stage = plan["stages"][k];
    // One row per stage: its name, its worker (round robin), its blocks, its parameters.
    std::string row = stage["name"].get<std::string>();
    row += std::string(9 - row.size(), ' ') + "worker" + std::to_string(k + 1);
    EXPECT_TRUE(contains(r.output, row)) << row << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, stage["blocks"].get<std::string>() + " ")) << r.output;
    EXPECT_TRUE(contains(r.output, " " + std::to_string(stage["parameters"].get<int64_t>()) + " "))
        << r.output;
  }
  std::ifstream in(metrics);
  auto epochs = nlohmann::json::parse(in)["epochs"];
  double best_iou = 0;
  for (const auto& epoch : epochs) best_iou = std::max(best_iou, epoch["val_iou"].get<double>());
  EXPECT_GT(best_iou, 0.45) << r.output;
  std::remove(metrics.c_str());
}

TEST(TrainingJob, BadStageSettingsAreClearErrors) {
  std::string job = std::string(FERRY_LAUNCH) + " --nproc 1 -- " + FERRY_MASTER +
                    " train --image-size 32 --samples 40 --epochs 1 --batch-size 4"
                    " --model unet-resnet18";
  const std::pair<std::string, std::string> cases[] = {
      {" --stages 99", "--stages 99: the U-Net has 15 blocks, so 1 to 15 stages"},
      {" --stages 2 --balance speed",
       "--balance must be memory, time or parameters, not \"speed\""},
      {" --partition layer9.0", "--partition layer9.0: \"layer9.0\" is not the name of a block"},
      {" --partition layer3.0 --stages 3", "--partition layer3.0 makes 2 stages but --stages is 3"},
      {" --stages 2 --placement stage5=master",
       "--placement: \"stage5=master\" is not stage=worker with a stage among stage0, stage1"},
      {" --placement decoder=master/cuda:99",
       "placing stage \"decoder\" on master/cuda:99: to of stage \"unet.blocks\" on worker "
       "\"master\" failed: worker \"master\" has no device cuda:99 (it has"},
  };
  for (const auto& [flags, message] : cases) {
    CommandResult r = run(job + flags);
    EXPECT_NE(r.status, 0) << flags;
    EXPECT_TRUE(contains(r.output, message)) << flags << "\n" << r.output;
  }
  CommandResult budget = run("env FERRY_MEMORY_BUDGET_MIB=12x " + std::string(FERRY_MASTER) +
                             " describe --model unet-resnet18 --image-size 64");
  EXPECT_NE(budget.status, 0);
  EXPECT_TRUE(contains(
      budget.output, "FERRY_MEMORY_BUDGET_MIB=\"12x\" is not a whole, non-negative number of MiB"))
      << budget.output;
}

// A budget of B MiB per process stands for a device of B MiB: the whole model on one worker does
// not fit it and the job fails saying where; cut into four stages, the same batch trains.
TEST(TrainingJob, ABatchOverTheMemoryBudgetFailsNamingWorkerAndStageAndFitsOverMoreStages) {
  const std::string job = std::string(FERRY_MASTER) +
                          " train --model unet-resnet18 --image-size 64 --samples 40 --epochs 1"
                          " --batch-size 8 --optimizer adam --memory-budget-mib 200";
  CommandResult one = run(std::string(FERRY_LAUNCH) + " --nproc 2 -- " + job + " --stages 1");
  EXPECT_NE(one.status, 0) << one.output;
  EXPECT_TRUE(contains(one.output, "out of memory: a tensor of")) << one.output;
  EXPECT_TRUE(contains(one.output, "over this process's tensor memory budget of 200 MiB"))
      << one.output;
  EXPECT_TRUE(contains(one.output, "worker \"worker1\" holds stage stage0 (blocks stem..head)"))
      << one.output;
  EXPECT_TRUE(contains(one.output, "cut the model into more stages (--stages)")) << one.output;

  CommandResult four = run(std::string(FERRY_LAUNCH) + " --nproc 5 -- " + job + " --stages 4");
  EXPECT_EQ(four.status, 0) << four.output;
  EXPECT_TRUE(contains(four.output, "epoch 1/1: train loss")) << four.output;
}

TEST(TrainingJob, UnknownModelIsAClearError) {
  CommandResult r = run(std::string(FERRY_MASTER) + " describe --model unet-resnet42");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "no ResNet of depth 42")) << r.output;
}

// Every stage's tensors in checkpoint `folder` by name, and the values saved beside them.
struct SavedCheckpoint {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, c10::IValue> values;
};

SavedCheckpoint read_checkpoint(const std::string& folder) {
  SavedCheckpoint out;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (entry.path().extension() != ".pt") continue;
    c10::IValue value = torch::pickle_load(bytes(entry.path().string()));
    if (!value.isGenericDict()) {
      out.values[entry.path().stem().string()] = value;
      continue;
    }
    for (const auto& item : value.toGenericDict()) {
      out.tensors[item.key().toStringRef()] = item.value().toTensor().to(at::kDouble);
    }
  }
  return out;
}

// The largest difference between same-named tensors, relative to the tensor's size.
double largest_relative_difference(const SavedCheckpoint& a, const SavedCheckpoint& b) {
  EXPECT_EQ(a.tensors.size(), b.tensors.size());
  double largest = 0;
  for (const auto& [name, tensor] : a.tensors) {
    const at::Tensor& other = b.tensors.at(name);
    double scale = std::max(other.norm().item<double>(), 1e-12);
    largest = std::max(largest, (tensor - other).norm().item<double>() / scale);
  }
  return largest;
}

// The job of the equivalence tests: batch norm frozen (a batch's images do not see each other)
// and a loss that is a mean over pixels, so that gradients of parts of a batch add up to the
// whole batch's. Two stages.
std::string equivalence_job(int processes) {
  return std::string(FERRY_LAUNCH) + " --nproc " + std::to_string(processes) + " -- " +
         FERRY_MASTER +
         " train --model unet-resnet18 --image-size 32 --samples 20 --epochs 1 --optimizer sgd"
         " --lr 0.05 --loss bce --freeze-batchnorm --seed 5 --partition decoder.0";
}

// Trains into checkpoint folder `dir` and returns what it saved.
SavedCheckpoint train_into(const std::string& dir, const std::string& command) {
  CommandResult r = run(command + " --checkpoint-dir " + dir);
  EXPECT_EQ(r.status, 0) << r.output;
  SavedCheckpoint saved =
      r.status == 0 ? read_checkpoint(latest_checkpoint(dir)) : SavedCheckpoint{};
  std::filesystem::remove_all(dir);
  return saved;
}

// Four batches of two summed into one optimizer step are one step on their eight images
// together: plain and pipelined.
TEST(TrainingJob, AccumulatingFourBatchesOfTwoStepsAsOneBatchOfEight) {
  const std::string base = "/tmp/ferry-accumulate-" + std::to_string(getpid());
  for (const std::string pipeline : {"", " --pipeline 1f1b --microbatches 2"}) {
    SCOPED_TRACE(pipeline);
    SavedCheckpoint eight = train_into(base, equivalence_job(3) + pipeline + " --batch-size 8");
    SavedCheckpoint summed =
        train_into(base, equivalence_job(3) + pipeline + " --batch-size 2 --accumulate 4");
    ASSERT_GT(eight.tensors.size(), 100u);
    // 16 training images: two optimizer steps either way.
    EXPECT_EQ(eight.values.at("step").toInt(), 2);
    EXPECT_EQ(summed.values.at("step").toInt(), 2);
    EXPECT_LE(largest_relative_difference(eight, summed), 1e-5);
    if (pipeline.empty()) {
      // Eight steps on batches of two end elsewhere: the equality above is the sum's.
      SavedCheckpoint apart = train_into(base, equivalence_job(3) + " --batch-size 2");
      EXPECT_GT(largest_relative_difference(eight, apart), 1e-3);
    }
  }
}

// Data parallel beside model parallel: two replicas of two stages, each on four images of every
// step, end where one copy trained on the eight images together ends.
TEST(TrainingJob, TwoReplicasOfTwoStagesStepAsOneCopyOnBothShares) {
  const std::string base = "/tmp/ferry-replicas-" + std::to_string(getpid());
  for (const std::string pipeline : {"", " --pipeline gpipe --microbatches 2"}) {
    SCOPED_TRACE(pipeline);
    SavedCheckpoint one = train_into(base, equivalence_job(3) + pipeline + " --batch-size 8");
    CommandResult r = run(equivalence_job(5) + pipeline +
                          " --batch-size 4 --replicas 2 --checkpoint-dir " + base);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "replica 1: stage0@1 worker3, stage1@1 worker4")) << r.output;
    SavedCheckpoint two = read_checkpoint(latest_checkpoint(base));
    std::filesystem::remove_all(base);
    ASSERT_GT(one.tensors.size(), 100u);
    EXPECT_EQ(two.values.at("step").toInt(), 2);
    EXPECT_LE(largest_relative_difference(one, two), 1e-5);
  }
}

// A run that stops after epoch 1 and resumes goes on along the same learning-rate curve and
// ends where the uninterrupted run ends.
TEST(TrainingJob, AScheduleResumesOnTheSameCurve) {
  const std::string base = "/tmp/ferry-schedule-" + std::to_string(getpid());
  const std::string job = std::string(FERRY_LAUNCH) + " --nproc 3 -- " + FERRY_MASTER +
                          " train --model unet-resnet18 --image-size 32 --samples 40"
                          " --batch-size 8 --epochs 2 --optimizer adam --lr 0.01"
                          " --lr-schedule cosine --warmup-steps 2 --seed 2 --checkpoint-dir " +
                          base;
  CommandResult full = run(job + " --metrics-file " + base + "-full.json");
  ASSERT_EQ(full.status, 0) << full.output;
  EXPECT_TRUE(contains(full.output, "learning rate: cosine from 0.01 over 8 steps, 2 warm-up"))
      << full.output;
  const std::string second = latest_checkpoint(base);
  SavedCheckpoint uninterrupted = read_checkpoint(second);
  // The interruption: the first epoch's checkpoint (kept beside the second) becomes the latest.
  std::string first;
  for (const auto& entry : std::filesystem::directory_iterator(base)) {
    if (entry.is_directory() && entry.path().string() != second) first = entry.path().string();
  }
  ASSERT_FALSE(first.empty());
  ASSERT_EQ(read_checkpoint(first).values.at("epoch").toInt(), 1);
  std::ofstream(base + "/LATEST", std::ios::trunc)
      << std::filesystem::path(first).filename().string() << "\n";

  CommandResult resumed = run(job + " --resume --metrics-file " + base + "-resumed.json");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "after epoch 1 (optimizer step 4)")) << resumed.output;
  auto full_epochs = nlohmann::json::parse(std::ifstream(base + "-full.json"))["epochs"];
  auto resumed_epochs = nlohmann::json::parse(std::ifstream(base + "-resumed.json"))["epochs"];
  ASSERT_EQ(full_epochs.size(), 2u);
  ASSERT_EQ(resumed_epochs.size(), 1u);
  EXPECT_EQ(resumed_epochs[0]["lr"].get<double>(), full_epochs[1]["lr"].get<double>());
  EXPECT_LT(full_epochs[1]["lr"].get<double>(), full_epochs[0]["lr"].get<double>());
  SavedCheckpoint after = read_checkpoint(latest_checkpoint(base));
  EXPECT_EQ(after.values.at("step").toInt(), 8);
  EXPECT_LE(largest_relative_difference(after, uninterrupted), 1e-5);
  std::filesystem::remove_all(base);
  std::remove((base + "-full.json").c_str());
  std::remove((base + "-resumed.json").c_str());
}

// The validation masks are the inverse of what the training set teaches: the validation loss
// is best early, the run stops `patience` epochs later and keeps the best epoch's checkpoint.
TEST(TrainingJob, KeepsTheBestEpochAndStopsWhenTheMetricNoLongerImproves) {
  const std::string data = write_folder_data_set(16, 4);
  const std::string checkpoints = data + "-checkpoints";
  const std::string metrics_file = data + ".json";
  CommandResult r =
      run(std::string(FERRY_LAUNCH) + " --nproc 2 -- " + FERRY_MASTER +
          " train --model unet-resnet18 --data " + data +
          " --crop --image-size 32 --batch-size 4 --epochs 10 --optimizer adam --lr 0.003"
          " --monitor val_loss --save-best --early-stop-patience 2 --checkpoint-dir " +
          checkpoints + " --metrics-file " + metrics_file);
  ASSERT_EQ(r.status, 0) << r.output;
  auto metrics = nlohmann::json::parse(std::ifstream(metrics_file));
  ASSERT_TRUE(metrics.contains("stopped_after_epoch")) << r.output;
  const int stopped = metrics["stopped_after_epoch"].get<int>();
  const int best = metrics["best_epoch"].get<int>();
  EXPECT_LT(stopped, 10);
  EXPECT_EQ(stopped, best + 2);
  const auto& epochs = metrics["epochs"];
  ASSERT_EQ(static_cast<int>(epochs.size()), stopped);
  for (const auto& epoch : epochs) {
    EXPECT_GE(epoch["val_loss"].get<double>(), epochs[best - 1]["val_loss"].get<double>());
  }
  EXPECT_TRUE(contains(r.output, "best epoch: " + std::to_string(best) + " (val_loss "))
      << r.output;
  EXPECT_TRUE(contains(r.output, "its checkpoint: " + checkpoints + "/best/ckpt-")) << r.output;
  EXPECT_TRUE(contains(r.output, "stopped early after epoch " + std::to_string(stopped) +
                                     ": val_loss did not improve for 2 epochs"))
      << r.output;
  SavedCheckpoint kept = read_checkpoint(latest_checkpoint(checkpoints + "/best"));
  EXPECT_EQ(kept.values.at("epoch").toInt(), best);
  EXPECT_EQ(read_checkpoint(latest_checkpoint(checkpoints)).values.at("epoch").toInt(), stopped);
  std::filesystem::remove_all(data);
  std::filesystem::remove_all(checkpoints);
  std::remove(metrics_file.c_str());
}

TEST(TrainingJob, BadTrainingSettingsAreClearErrorsBeforeAnyStageIsBuilt) {
  const std::string job = std::string(FERRY_LAUNCH) + " --nproc 1 -- " + FERRY_MASTER +
                          " train --image-size 32 --samples 40 --epochs 1 --batch-size 4"
                          " --model unet-resnet18";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" --lr-schedule linear",
       "--lr-schedule: learning-rate schedule \"linear\" is none of constant, step, cosine, "
       "onecycle"},
      {" --lr-schedule cosine --warmup-steps 8",
       "8 warm-up steps leave none of the run's 8 optimizer steps"},
      {" --save-best", "--save-best needs --checkpoint-dir"},
      {" --monitor val_acc", "--monitor must be val_loss, val_iou or val_dice, not \"val_acc\""},
      {" --accumulate 0", "--accumulate"},
      {" --replicas 2",
       "--replicas 2 needs a worker of its own for each replica at least; the "
       "world has 0 besides the master"},
  };
  for (const auto& [flags, message] : cases) {
    CommandResult r = run(job + flags);
    EXPECT_NE(r.status, 0) << flags;
    EXPECT_TRUE(contains(r.output, message)) << flags << "\n" << r.output;
    EXPECT_FALSE(contains(r.output, "encoder  ")) << "a stage was planned: " << r.output;
  }
}

}  // namespace
