// The binaries a user runs: ferry-launch starting a world of ferry-master processes that train
// the U-Net on the synthetic set or a folder of images, ferry-launch's handling of a rank that
// dies, and ferry-master describe.
#include <gmock/gmock.h>
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

#include "tests/support/temp_dir.h"
#include "tests/support/time_scale.h"
#include "tests/support/training_runs.h"

namespace {

using ::testing::HasSubstr;

using ferry::testing::CommandResult;
using ferry::testing::file_bytes;
using ferry::testing::latest_checkpoint;
using ferry::testing::read_checkpoint;
using ferry::testing::run;
using ferry::testing::SavedCheckpoint;

TEST(TrainingJob, FourProcessesLearnTheSyntheticSet) {
  std::string metrics = ferry::testing::process_temp_dir().file("train-test.json");
  std::string logs = ferry::testing::process_temp_dir().file("train-logs");
  CommandResult r = run(std::string(FERRY_LAUNCH) + " --nproc 4 -- " + FERRY_MASTER +
                        " train --model unet-resnet18 --image-size 64 --samples 320 --epochs 3"
                        " --batch-size 8 --optimizer adam --lr 0.003 --metrics-file " +
                        metrics + " --log-dir " + logs);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[rank 0] epoch 3/3")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("encoder  worker1")) << r.output;
  std::ifstream in(metrics);
  auto epochs = nlohmann::json::parse(in)["epochs"];
  // Three short epochs reach a best validation IoU of 0.57-0.71 here.
  EXPECT_EQ(ferry::testing::learning_shortfall(epochs), "") << r.output;

  // --log-dir: the same figures, a row per epoch, and each worker busy for part of the time.
  auto rows = ferry::testing::read_metrics_csv(logs + "/metrics.csv");
  ASSERT_EQ(rows.size(), 3u) << r.output;
  for (size_t e = 0; e < rows.size(); ++e) {
    EXPECT_EQ(rows[e]["epoch"], e + 1.0);
    for (const char* name : {"train_loss", "val_loss", "val_iou", "val_dice", "lr"}) {
      EXPECT_EQ(rows[e][name], epochs[e][name].get<double>()) << name << " of epoch " << e + 1;
    }
    for (const char* stage : {"busy_encoder", "busy_decoder", "busy_head"}) {
      EXPECT_GT(rows[e][stage], 0.0) << stage;
      EXPECT_LE(rows[e][stage], 1.01) << stage;
    }
  }
  EXPECT_TRUE(ferry::testing::parses_as_svg(logs + "/metrics.svg"));
  EXPECT_THAT(r.output, HasSubstr("their curves in " + logs + "/metrics.svg")) << r.output;
  std::remove(metrics.c_str());
  std::filesystem::remove_all(logs);
}

// A folder of red squares on noise with their masks, as a user's data set would be laid out.
// The `inverted` samples after them (in name order: the validation share) have their masks
// inverted, so that learning the training set makes the validation metrics worse.
std::string write_folder_data_set(int count, int inverted = 0) {
  std::string dir = ferry::testing::process_temp_dir().file("folder-job");
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

TEST(TrainingJob, TrainsOnAFolderAndStartsFromSavedWeights) {
  std::string data = write_folder_data_set(16);
  std::string checkpoints = data + "-checkpoints";
  std::string common = std::string(FERRY_LAUNCH) + " --nproc 2 -- " + FERRY_MASTER +
                       " train --model unet-resnet18 --data " + data +
                       " --crop --image-size 32 --epochs 1 --batch-size 4";
  CommandResult first = run(common + " --checkpoint-dir " + checkpoints);
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_THAT(first.output, HasSubstr("data: 16 image/mask pairs from " + data)) << first.output;
  EXPECT_THAT(first.output, HasSubstr("epoch 1/1: train loss")) << first.output;

  // The encoder stage's checkpoint file, its names made those of a torchvision ResNet (a stage's
  // file has the whole U-Net's names, "encoder.conv1.weight").
  auto saved = torch::pickle_load(file_bytes(latest_checkpoint(checkpoints) + "/encoder.pt"))
                   .to<c10::Dict<std::string, at::Tensor>>();
  c10::Dict<std::string, at::Tensor> resnet;
  for (const auto& item : saved) resnet.insert(item.key().substr(8), item.value());
  ASSERT_EQ(saved.begin()->key().substr(0, 8), "encoder.");
  std::string encoder = checkpoints + "/resnet18.pt";
  std::vector<char> written = torch::pickle_save(c10::IValue(resnet));
  std::ofstream(encoder, std::ios::binary).write(written.data(), written.size());
  CommandResult second = run(common + " --weights " + encoder);
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_THAT(second.output, HasSubstr("weights loaded from " + encoder)) << second.output;

  // A file that is not there stops the job before it trains, naming the file.
  CommandResult missing = run(common + " --weights " + data + "/nothing.pt");
  EXPECT_NE(missing.status, 0);
  EXPECT_THAT(missing.output,
              HasSubstr("weights file \"" + data + "/nothing.pt\": cannot be opened"))
      << missing.output;

  // A broken image fails the epoch with the file's name.
  std::ofstream(data + "/images/sample3.jpg", std::ios::trunc) << "not a JPEG";
  CommandResult broken = run(common);
  EXPECT_NE(broken.status, 0);
  EXPECT_THAT(broken.output, HasSubstr("cannot read \"" + data + "/images/sample3.jpg\""))
      << broken.output;
  std::filesystem::remove_all(data);
  std::filesystem::remove_all(checkpoints);
}

TEST(TrainingJob, LauncherStopsTheWorldWhenARankDiesAndSaysWhich) {
  auto start = std::chrono::steady_clock::now();
  CommandResult r = run(std::string(FERRY_LAUNCH) +
                        " --nproc 3 --grace-s 1 -- sh -c 'echo hello from $RANK of $WORLD_SIZE; "
                        "if [ $RANK = 1 ]; then sleep 1; exit 3; fi; sleep 60'");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[rank 2] hello from 2 of 3")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 1 (pid")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("exited with status 3; rank 0 has 1 s to end by itself"))
      << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 0 did not end within 1 s; stopping the others"))
      << r.output;
  // Long before the other ranks' minute of sleep.
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            ferry::testing::scaled(std::chrono::seconds(40)));
}

// A worker killed in the middle of a run: the master's own explanation (the stages it held, the
// checkpoint to resume from) still reaches the user before the launcher stops the world.
TEST(TrainingJob, UnderTheLauncherTheMasterExplainsALostWorker) {
  const std::string dir = ferry::testing::process_temp_dir().file("lost-under-launch");
  const std::string train = std::string(FERRY_MASTER) +
                            " train --model unet-resnet18 --image-size 32 --samples 40"
                            " --batch-size 8 --epochs 40 --checkpoint-dir " +
                            dir;
  // Rank 2 is killed once the first checkpoint is there (bounded: a minute at most).
  CommandResult r = run(std::string(FERRY_LAUNCH) + " --nproc 3 -- sh -c 'if [ $RANK = 2 ]; then " +
                        train + " & p=$!; i=0; while [ ! -e " + dir +
                        "/LATEST ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; "
                        "kill -9 $p; wait $p; exit 9; else exec " +
                        train + "; fi'");
  EXPECT_EQ(r.status, 1) << r.output;
  const size_t lost = r.output.find("exited with status 9; rank 0 has 30 s to end by itself");
  const size_t explained = r.output.find("worker \"worker2\" held stage");
  const size_t intact =
      r.output.find("the last checkpoint in " + dir + " is intact: --resume continues from it");
  const size_t stopped = r.output.find("stopping the others");
  EXPECT_NE(lost, std::string::npos) << r.output;
  EXPECT_NE(explained, std::string::npos) << r.output;
  EXPECT_NE(intact, std::string::npos) << r.output;
  ASSERT_NE(stopped, std::string::npos) << r.output;
  EXPECT_LT(explained, stopped) << r.output;
  // The master ended by itself, and only then were the others stopped.
  const size_t master_ended = r.output.find("ferry-launch: rank 0 (pid ");
  ASSERT_NE(master_ended, std::string::npos) << r.output;
  const std::string by_itself = ") exited with status 1; stopping the others\n";
  EXPECT_EQ(r.output.substr(r.output.find(')', master_ended), by_itself.size()), by_itself)
      << r.output;
  std::filesystem::remove_all(dir);
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
  std::string base = ferry::testing::process_temp_dir().file("pipelined");
  CommandResult r = run(std::string(FERRY_LAUNCH) + " --nproc 4 -- " + FERRY_MASTER +
                        " train --model unet-resnet18 --image-size 64 --samples 200 --epochs 2"
                        " --batch-size 8 --optimizer adam --lr 0.003 --pipeline 1f1b"
                        " --microbatches 4 --checkpoint-activations --trace " +
                        base + ".trace.json --metrics-file " + base + ".json --log-dir " + base);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("pipelined steps: 1f1b, 4 micro-batches of 2 images, "
                                  "activations recomputed in backward"))
      << r.output;
  EXPECT_THAT(r.output, HasSubstr("stage 0: encoder on worker1")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("ideal (p - 1) / (M + p - 1) = 33% (p = 3, M = 4)")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("most activations held at once: encoder")) << r.output;
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
        event["args"]["name"].get<std::string>().find("receives") == std::string::npos) {
      ++stage_tracks;
    }
    if (event["ph"] == "X" && event["cat"] == "backward") ++backwards;
  }
  EXPECT_EQ(stage_tracks, 3);
  // 160 training images: 20 steps of 4 micro-batches an epoch, each through 3 stages.
  EXPECT_EQ(backwards, 2 * 20 * 4 * 3);
  // Each stage's busy share per epoch, from the timeline.
  auto rows = ferry::testing::read_metrics_csv(base + "/metrics.csv");
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows) {
    for (const char* stage : {"busy_encoder", "busy_decoder", "busy_head"}) {
      EXPECT_GT(row.at(stage), 0.0) << stage;
      EXPECT_LE(row.at(stage), 1.01) << stage;
    }
  }
  std::filesystem::remove_all(base);
  std::remove((base + ".json").c_str());
  std::remove((base + ".trace.json").c_str());
}

TEST(TrainingJob, BadPipelineSettingsAreClearErrors) {
  std::string job = std::string(FERRY_LAUNCH) + " --nproc 1 -- " + FERRY_MASTER +
                    " train --image-size 32 --samples 40 --epochs 1 --batch-size 4"
                    " --model unet-resnet18";
  CommandResult r = run(job + " --pipeline zigzag");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.output, HasSubstr("--pipeline: must be gpipe, 1f1b or zb, not \"zigzag\""))
      << r.output;
  r = run(job + " --microbatches 8");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.output, HasSubstr("--microbatches 8 is more than the 4 images of a batch"))
      << r.output;
  r = run(job + " --pipeline gpipe --via-master");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.output, HasSubstr("--via-master is the naive split; it cannot be pipelined"))
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

  std::string metrics = ferry::testing::process_temp_dir().file("stages-test.json");
  CommandResult r =
      run(std::string(FERRY_LAUNCH) + " --nproc 5 -- " + FERRY_MASTER + " train" + plan_flags +
          " --samples 320 --epochs 3 --lr 0.003 --metrics-file " + metrics);
  ASSERT_EQ(r.status, 0) << r.output;
  for (size_t k = 0; k < 4; ++k) {
    const auto& stage = plan["stages"][k];
    // One row per stage: its name, its worker (round robin), its blocks, its parameters.
    std::string row = stage["name"].get<std::string>();
    row += std::string(9 - row.size(), ' ') + "worker" + std::to_string(k + 1);
    EXPECT_THAT(r.output, HasSubstr(row)) << row << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(stage["blocks"].get<std::string>() + " ")) << r.output;
    EXPECT_THAT(r.output, HasSubstr(" " + std::to_string(stage["parameters"].get<int64_t>()) + " "))
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
       "--balance: must be memory, time or parameters, not \"speed\""},
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
    EXPECT_THAT(r.output, HasSubstr(message)) << flags << "\n" << r.output;
  }
  CommandResult budget = run("env FERRY_MEMORY_BUDGET_MIB=12x " + std::string(FERRY_MASTER) +
                             " describe --model unet-resnet18 --image-size 64");
  EXPECT_NE(budget.status, 0);
  EXPECT_THAT(
      budget.output,
      HasSubstr("FERRY_MEMORY_BUDGET_MIB=\"12x\" is not a whole, non-negative number of MiB"))
      << budget.output;
  CommandResult beside = run(std::string(FERRY_MASTER) +
                             " describe --model unet-resnet18 --image-size 64 --neighbours 1");
  EXPECT_NE(beside.status, 0);
  EXPECT_THAT(beside.output, HasSubstr("--neighbours 1 needs --threads 1")) << beside.output;
}

// A budget of B MiB per process stands for a device of B MiB: the whole model on one worker does
// not fit it and the job fails saying where; cut into four stages, the same batch trains. With a
// budget per worker, each worker keeps its own.
TEST(TrainingJob, ABatchOverTheMemoryBudgetFailsNamingWorkerAndStageAndFitsOverMoreStages) {
  const std::string job = std::string(FERRY_MASTER) +
                          " train --model unet-resnet18 --image-size 64 --samples 40 --epochs 1"
                          " --batch-size 8 --optimizer adam --memory-budget-mib 200";
  CommandResult one = run(std::string(FERRY_LAUNCH) + " --nproc 2 -- " + job + " --stages 1");
  EXPECT_NE(one.status, 0) << one.output;
  EXPECT_THAT(one.output, HasSubstr("out of memory: a tensor of")) << one.output;
  EXPECT_THAT(one.output, HasSubstr("over this process's tensor memory budget of 200 MiB"))
      << one.output;
  EXPECT_THAT(one.output, HasSubstr("worker \"worker1\" holds stage stage0 (blocks stem..head)"))
      << one.output;
  EXPECT_THAT(one.output, HasSubstr("cut the model into more stages (--stages)")) << one.output;

  CommandResult four = run(std::string(FERRY_LAUNCH) + " --nproc 5 -- " + job + " --stages 4");
  EXPECT_EQ(four.status, 0) << four.output;
  EXPECT_THAT(four.output, HasSubstr("epoch 1/1: train loss")) << four.output;

  // A budget per worker, each rank its own: worker2's 40 MiB binds, worker1's 1000 does not.
  const std::string each_job = std::string(FERRY_MASTER) +
                               " train --model unet-resnet18 --image-size 64 --samples 40"
                               " --epochs 1 --batch-size 8 --optimizer adam --stages 2";
  CommandResult each =
      run(std::string(FERRY_LAUNCH) + " --nproc 3 -- " + each_job + " --memory-budget-mib 1000,40");
  EXPECT_EQ(each.status, 3) << each.output;
  EXPECT_THAT(each.output, HasSubstr("over this process's tensor memory budget of 40 MiB"))
      << each.output;
  EXPECT_THAT(each.output, HasSubstr("worker \"worker2\" holds stage stage1")) << each.output;
  // As many budgets as workers, or no process starts its work.
  CommandResult miscounted =
      run(std::string(FERRY_LAUNCH) + " --nproc 2 -- " + each_job + " --memory-budget-mib 300,300");
  EXPECT_EQ(miscounted.status, 2) << miscounted.output;
  EXPECT_THAT(miscounted.output, HasSubstr("--memory-budget-mib 300,300: 2 budgets, one per "
                                           "worker, for a world of 1 besides the master"))
      << miscounted.output;
}

TEST(TrainingJob, UnknownModelIsAClearError) {
  CommandResult r = run(std::string(FERRY_MASTER) + " describe --model unet-resnet42");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.output, HasSubstr("no ResNet of depth 42")) << r.output;
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
  EXPECT_THAT(r.output, HasSubstr("best epoch: " + std::to_string(best) + " (val_loss "))
      << r.output;
  EXPECT_THAT(r.output, HasSubstr("its checkpoint: " + checkpoints + "/best/ckpt-")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("stopped early after epoch " + std::to_string(stopped) +
                                  ": val_loss did not improve for 2 epochs"))
      << r.output;
  SavedCheckpoint kept = read_checkpoint(latest_checkpoint(checkpoints + "/best"));
  EXPECT_EQ(kept.values.at("epoch").toInt(), best);
  EXPECT_EQ(read_checkpoint(latest_checkpoint(checkpoints)).values.at("epoch").toInt(), stopped);
  std::filesystem::remove_all(data);
  std::filesystem::remove_all(checkpoints);
  std::remove(metrics_file.c_str());
}

}  // namespace
