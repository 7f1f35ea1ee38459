// What a training job offers beside stages and pipelines, run as a user runs it (ferry-launch,
// ferry-master train): gradient accumulation, where the loss is computed, data-parallel replicas,
// learning-rate schedules, bf16-mixed precision, blocks moved between stages while training, and
// the errors of settings that cannot work.
#include <ATen/TensorOperators.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/temp_dir.h"
#include "tests/support/training_runs.h"

namespace {

using ferry::testing::CommandResult;
using ferry::testing::largest_relative_difference;
using ferry::testing::latest_checkpoint;
using ferry::testing::read_checkpoint;
using ferry::testing::rewind_checkpoint;
using ferry::testing::run;
using ferry::testing::SavedCheckpoint;
using ::testing::HasSubstr;
using ::testing::Not;

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
  const std::string base = ferry::testing::process_temp_dir().file("accumulate");
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

// The loss on the last stage (only its value comes to the master) and on the master (the logits
// come to it, their gradients go back) train the same: plain steps, and pipelined ones with
// recomputed activations.
TEST(TrainingJob, TheLossOnTheLastStageTrainsAsTheLossOnTheMaster) {
  const std::string base = ferry::testing::process_temp_dir().file("loss_on");
  for (const std::string steps :
       {"", " --pipeline 1f1b --microbatches 2 --checkpoint-activations"}) {
    SCOPED_TRACE(steps);
    const std::string job = equivalence_job(3) + " --batch-size 4" + steps;
    SavedCheckpoint on_stage = train_into(base, job + " --loss-on last-stage");
    SavedCheckpoint on_master = train_into(base, job + " --loss-on master");
    ASSERT_GT(on_stage.tensors.size(), 100u);
    EXPECT_EQ(on_stage.values.at("step").toInt(), 4);
    EXPECT_LE(largest_relative_difference(on_stage, on_master), 1e-5);
  }
}

// The zero-bubble schedule defers each backward's weight pass: the job ends where 1F1B's ends, and
// two replicas under it (their buckets take the deferred passes' gradients) where one copy on both
// shares ends.
TEST(TrainingJob, TheZeroBubbleScheduleTrainsAsOneFOneBAlsoWithReplicas) {
  const std::string base = ferry::testing::process_temp_dir().file("zero_bubble");
  const std::string pipelined = " --microbatches 2 --pipeline ";
  SavedCheckpoint one_f_one_b =
      train_into(base, equivalence_job(3) + pipelined + "1f1b --batch-size 4");
  SavedCheckpoint zero_bubble =
      train_into(base, equivalence_job(3) + pipelined + "zb --batch-size 4");
  ASSERT_GT(zero_bubble.tensors.size(), 100u);
  EXPECT_EQ(zero_bubble.values.at("step").toInt(), 4);
  EXPECT_LE(largest_relative_difference(one_f_one_b, zero_bubble), 1e-5);

  SavedCheckpoint one = train_into(base, equivalence_job(3) + pipelined + "zb --batch-size 8");
  SavedCheckpoint two =
      train_into(base, equivalence_job(5) + pipelined + "zb --batch-size 4 --replicas 2");
  ASSERT_GT(two.tensors.size(), 100u);
  EXPECT_EQ(two.values.at("step").toInt(), 2);
  EXPECT_LE(largest_relative_difference(one, two), 1e-5);
}

// Data parallel beside model parallel: two replicas of two stages, each on four images of every
// step, end where one copy trained on the eight images together ends.
TEST(TrainingJob, TwoReplicasOfTwoStagesStepAsOneCopyOnBothShares) {
  const std::string base = ferry::testing::process_temp_dir().file("replicas");
  for (const std::string pipeline : {"", " --pipeline gpipe --microbatches 2"}) {
    SCOPED_TRACE(pipeline);
    SavedCheckpoint one = train_into(base, equivalence_job(3) + pipeline + " --batch-size 8");
    CommandResult r = run(equivalence_job(5) + pipeline +
                          " --batch-size 4 --replicas 2 --checkpoint-dir " + base);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("replica 1: stage0@1 worker3, stage1@1 worker4")) << r.output;
    SavedCheckpoint two = read_checkpoint(latest_checkpoint(base));
    std::filesystem::remove_all(base);
    ASSERT_GT(one.tensors.size(), 100u);
    EXPECT_EQ(two.values.at("step").toInt(), 2);
    EXPECT_LE(largest_relative_difference(one, two), 1e-5);
  }
}

// The batch norms' running statistics alone.
SavedCheckpoint running_statistics(SavedCheckpoint saved) {
  for (auto it = saved.tensors.begin(); it != saved.tensors.end();) {
    it = it->first.find(".running_") == std::string::npos ? saved.tensors.erase(it) : std::next(it);
  }
  return saved;
}

// Batch norms that train, one optimizer step on eight images (the 10 samples leave 8 for
// training), on images as they are, in [0, 1]: normalised to ImageNet's statistics, the batch
// norms' bias gradients cancel more, and float32's rounding of those sums, against the biases'
// small norms after one step, passes the bound below (the weights stay within it).
std::string batchnorm_job(int processes) {
  return std::string(FERRY_LAUNCH) + " --nproc " + std::to_string(processes) + " -- " +
         FERRY_MASTER +
         " train --model unet-resnet18 --image-size 32 --samples 10 --epochs 1 --optimizer sgd"
         " --lr 0.05 --loss bce --seed 5 --partition decoder.0 --normalize none";
}

// --sync-batchnorm: two replicas of two stages on four images each normalise by the statistics
// of all eight, so they step as one copy on the eight; without it they do not. The bound is
// float32's: a batch norm's gradients here are within 1e-5 of float64's.
TEST(TrainingJob, TwoReplicasWithSyncBatchnormStepAsOneCopyOnBothShares) {
  const std::string base = ferry::testing::process_temp_dir().file("syncbn");
  SavedCheckpoint one = train_into(base, batchnorm_job(3) + " --batch-size 8");
  CommandResult r = run(batchnorm_job(5) + " --batch-size 4 --replicas 2 --sync-batchnorm" +
                        " --checkpoint-dir " + base);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("batch norms: statistics of the whole step (30 layers, summed "
                                  "over 2 replicas)"))
      << r.output;
  SavedCheckpoint synced = read_checkpoint(latest_checkpoint(base));
  std::filesystem::remove_all(base);
  SavedCheckpoint apart =
      train_into(base, batchnorm_job(5) + " --batch-size 4 --replicas 2 --pipeline gpipe");
  ASSERT_GT(one.tensors.size(), 100u);
  EXPECT_EQ(synced.values.at("step").toInt(), 1);
  EXPECT_LE(largest_relative_difference(one, synced), 1e-4);
  EXPECT_LE(largest_relative_difference(running_statistics(one), running_statistics(synced)), 1e-5);
  EXPECT_GT(largest_relative_difference(running_statistics(one), running_statistics(apart)), 1e-3);
}

// --sync-batchnorm in a pipeline: each micro-batch is normalised by its own statistics, as
// torchgpipe's deferred batch norm does, but the running statistics move once per step, by all
// micro-batches together, and a recomputed forward does not move them again. The first batch
// norm sees the same images either way, so its statistics are the whole batch's.
TEST(TrainingJob, SyncBatchnormMovesRunningStatisticsOncePerPipelinedStep) {
  const std::string base = ferry::testing::process_temp_dir().file("syncbn-micro");
  const std::string pipelined =
      batchnorm_job(3) + " --batch-size 8 --pipeline 1f1b --microbatches 4";
  SavedCheckpoint whole =
      running_statistics(train_into(base, batchnorm_job(3) + " --batch-size 8"));
  SavedCheckpoint synced = train_into(base, pipelined + " --sync-batchnorm");
  SavedCheckpoint recomputed =
      train_into(base, pipelined + " --sync-batchnorm --checkpoint-activations");
  SavedCheckpoint apart = train_into(base, pipelined);
  ASSERT_GT(whole.tensors.size(), 50u);
  ASSERT_EQ(synced.tensors.count("encoder.bn1.num_batches_tracked"), 1u);
  EXPECT_EQ(synced.tensors.at("encoder.bn1.num_batches_tracked").item<double>(), 1);
  EXPECT_EQ(apart.tensors.at("encoder.bn1.num_batches_tracked").item<double>(), 4);
  for (const char* name : {"encoder.bn1.running_mean", "encoder.bn1.running_var"}) {
    const at::Tensor& truth = whole.tensors.at(name);
    EXPECT_LE((synced.tensors.at(name) - truth).norm().item<double>() / truth.norm().item<double>(),
              1e-5)
        << name;
  }
  EXPECT_LE(largest_relative_difference(running_statistics(synced), running_statistics(recomputed)),
            1e-5);
}

// A run that stops after epoch 1 and resumes goes on along the same learning-rate curve and
// ends where the uninterrupted run ends.
TEST(TrainingJob, AScheduleResumesOnTheSameCurve) {
  const std::string base = ferry::testing::process_temp_dir().file("schedule");
  const std::string job = std::string(FERRY_LAUNCH) + " --nproc 3 -- " + FERRY_MASTER +
                          " train --model unet-resnet18 --image-size 32 --samples 40"
                          " --batch-size 8 --epochs 2 --optimizer adam --lr 0.01"
                          " --lr-schedule cosine --warmup-steps 2 --seed 2 --checkpoint-dir " +
                          base + " --log-dir " + base + "-logs";
  CommandResult full = run(job + " --metrics-file " + base + "-full.json");
  ASSERT_EQ(full.status, 0) << full.output;
  EXPECT_THAT(full.output, HasSubstr("learning rate: cosine from 0.01 over 8 steps, 2 warm-up"))
      << full.output;
  SavedCheckpoint uninterrupted = read_checkpoint(latest_checkpoint(base));
  // The interruption: the first epoch's checkpoint (kept beside the second) becomes the latest.
  ASSERT_FALSE(rewind_checkpoint(base).empty());
  ASSERT_EQ(read_checkpoint(latest_checkpoint(base)).values.at("epoch").toInt(), 1);

  CommandResult resumed = run(job + " --resume --metrics-file " + base + "-resumed.json");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("after epoch 1 (optimizer step 4)")) << resumed.output;
  auto full_epochs = nlohmann::json::parse(std::ifstream(base + "-full.json"))["epochs"];
  auto resumed_epochs = nlohmann::json::parse(std::ifstream(base + "-resumed.json"))["epochs"];
  ASSERT_EQ(full_epochs.size(), 2u);
  ASSERT_EQ(resumed_epochs.size(), 1u);
  EXPECT_EQ(resumed_epochs[0]["lr"].get<double>(), full_epochs[1]["lr"].get<double>());
  EXPECT_LT(full_epochs[1]["lr"].get<double>(), full_epochs[0]["lr"].get<double>());
  // The resumed run's log keeps the first run's row of epoch 1 and replaces epoch 2's.
  auto rows = ferry::testing::read_metrics_csv(base + "-logs/metrics.csv");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["train_loss"], full_epochs[0]["train_loss"].get<double>());
  EXPECT_EQ(rows[1]["train_s"], resumed_epochs[0]["train_s"].get<double>());
  SavedCheckpoint after = read_checkpoint(latest_checkpoint(base));
  EXPECT_EQ(after.values.at("step").toInt(), 8);
  EXPECT_LE(largest_relative_difference(after, uninterrupted), 1e-5);
  std::filesystem::remove_all(base);
  std::filesystem::remove_all(base + "-logs");
  std::remove((base + "-full.json").c_str());
  std::remove((base + "-resumed.json").c_str());
}

TEST(TrainingJob, BadTrainingSettingsAreClearErrorsBeforeAnyStageIsBuilt) {
  const std::string job = std::string(FERRY_LAUNCH) + " --nproc 1 -- " + FERRY_MASTER +
                          " train --image-size 32 --samples 40 --epochs 1 --batch-size 4"
                          " --model unet-resnet18";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" --lr-schedule linear",
       "--lr-schedule: must be constant, step, cosine or onecycle, not \"linear\""},
      {" --lr-schedule cosine --warmup-steps 8",
       "8 warm-up steps leave none of the run's 8 optimizer steps"},
      {" --save-best", "--save-best needs --checkpoint-dir"},
      {" --checkpoint-every-steps 5", "--checkpoint-every-steps needs --checkpoint-dir"},
      {" --events /nonexistent-dir/events.jsonl",
       "--events: cannot open \"/nonexistent-dir/events.jsonl\""},
      {" --monitor val_acc",
       "--monitor: must be val_loss, val_iou, val_dice or val_miou, not \"val_acc\""},
      {" --accumulate 0", "--accumulate"},
      {" --loss lovasz", "--loss: unknown loss \"lovasz\""},
      {" --replicas 2",
       "--replicas 2 needs a worker of its own for each replica at least; the "
       "world has 0 besides the master"},
      {" --sync-batchnorm --freeze-batchnorm",
       "--sync-batchnorm with --freeze-batchnorm: frozen batch norms take no batch statistics"},
      {" --sync-batchnorm --via-master", "--sync-batchnorm needs pipelined steps"},
      {" --sync-batchnorm --replicas 2 --pipeline 1f1b",
       "--sync-batchnorm with --replicas and --pipeline 1f1b"},
  };
  for (const auto& [flags, message] : cases) {
    CommandResult r = run(job + flags);
    EXPECT_NE(r.status, 0) << flags;
    EXPECT_THAT(r.output, HasSubstr(message)) << flags << "\n" << r.output;
    EXPECT_THAT(r.output, Not(HasSubstr("encoder  "))) << "a stage was planned: " << r.output;
  }
}

// bf16-mixed: stages compute under autocast and send bfloat16, so the bytes every process sends
// per step fall by about half; weights stay float32, the loss falls, and a run resumed from a
// checkpoint ends where the uninterrupted one does. Small: on a CPU without bfloat16
// instructions (AVX2 only) bfloat16 convolutions run many times slower than float32 ones.
TEST(TrainingJob, BFloat16MixedHalvesTheBytesLearnsAndResumesExactly) {
  const std::string base = ferry::testing::process_temp_dir().file("bf16");
  const std::string job = std::string(FERRY_LAUNCH) + " --nproc 4 -- " + FERRY_MASTER +
                          " train --model unet-resnet18 --image-size 32 --batch-size 8"
                          " --optimizer adam --lr 0.003";
  CommandResult float32 = run(job + " --samples 40 --epochs 1 --metrics-file " + base + "-32.json");
  ASSERT_EQ(float32.status, 0) << float32.output;
  const std::string bf16_job = job +
                               " --samples 40 --epochs 2 --precision bf16-mixed"
                               " --checkpoint-dir " +
                               base;
  CommandResult mixed = run(bf16_job + " --metrics-file " + base + "-bf16.json");
  ASSERT_EQ(mixed.status, 0) << mixed.output;

  auto epochs_32 = nlohmann::json::parse(std::ifstream(base + "-32.json"))["epochs"];
  auto epochs = nlohmann::json::parse(std::ifstream(base + "-bf16.json"))["epochs"];
  const double bytes_32 = epochs_32[0]["bytes_per_step"].get<double>();
  const double bytes_16 = epochs[0]["bytes_per_step"].get<double>();
  EXPECT_LT(bytes_16, 0.6 * bytes_32) << bytes_16 << " bytes a step against " << bytes_32;
  EXPECT_GT(bytes_16, 0.4 * bytes_32) << bytes_16 << " bytes a step against " << bytes_32;
  ASSERT_EQ(epochs.size(), 2u);
  EXPECT_LT(epochs[1]["train_loss"].get<double>(), epochs[0]["train_loss"].get<double>())
      << mixed.output;

  SavedCheckpoint uninterrupted = read_checkpoint(latest_checkpoint(base));
  for (const auto& [name, dtype] : uninterrupted.dtypes) {
    if (name.find("num_batches_tracked") == std::string::npos) {
      EXPECT_EQ(dtype, at::kFloat) << name;
    }
  }
  ASSERT_FALSE(rewind_checkpoint(base).empty());
  CommandResult resumed = run(bf16_job + " --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("after epoch 1"));
  EXPECT_LE(largest_relative_difference(read_checkpoint(latest_checkpoint(base)), uninterrupted),
            1e-5);
  std::filesystem::remove_all(base);
  std::remove((base + "-32.json").c_str());
  std::remove((base + "-bf16.json").c_str());
}

// The re-balancing job: Adam (its moments must move with their blocks), one thread per process,
// two pipelined stages (by default cut after the encoder).
std::string rebalance_job(int epochs = 3, const std::string& partition = "decoder.0") {
  return std::string("env OMP_NUM_THREADS=1 ") + FERRY_LAUNCH + " --nproc 3 -- " + FERRY_MASTER +
         " train --model unet-resnet18 --image-size 32 --samples 30 --batch-size 4 --epochs " +
         std::to_string(epochs) +
         " --optimizer adam --lr 0.003 --seed 3 --pipeline 1f1b --microbatches 2 --partition " +
         partition;
}

// Blocks moved between stages, after the first epoch or within it (parameters, batch-norm
// statistics and Adam's moments by tensor name, worker to worker) change nothing that follows:
// every epoch's losses and the final weights and optimizer state are those of the run that kept
// its cut, and the master receives next to nothing of the state that moved.
TEST(Rebalance, AMoveBetweenEpochsOrWithinOneGivesTheLossesOfTheRunThatKeptItsCut) {
  const std::string base = ferry::testing::process_temp_dir().file("rebalance");
  auto run_with = [&base](const std::string& name, const std::string& flags) {
    CommandResult r = run(rebalance_job() + flags + " --checkpoint-dir " + base + name +
                          " --metrics-file " + base + name + ".json");
    EXPECT_EQ(r.status, 0) << r.output;
    return r.output;
  };
  run_with("-kept", "");
  const std::string between = run_with("-between", " --rebalance-to layer3.0 --rebalance-after 0");
  const std::string within = run_with("-within", " --rebalance-to layer3.0 --rebalance-after 3");
  const std::string moved =
      "stage0 stem..layer4.1 -> stem..layer2.1, stage1 decoder.0..head -> layer3.0..head";
  EXPECT_THAT(between, HasSubstr("re-balance after epoch 1: " + moved)) << between;
  EXPECT_THAT(within, HasSubstr("re-balance in epoch 1 after batch 3: " + moved)) << within;
  auto kept_json = nlohmann::json::parse(std::ifstream(base + "-kept.json"));
  EXPECT_TRUE(kept_json["rebalances"].empty());
  ASSERT_EQ(kept_json["epochs"].size(), 3u);
  SavedCheckpoint kept = read_checkpoint(latest_checkpoint(base + "-kept"));
  ASSERT_GT(kept.tensors.size(), 100u);
  for (const char* name : {"-between", "-within"}) {
    SCOPED_TRACE(name);
    auto json = nlohmann::json::parse(std::ifstream(base + name + ".json"));
    ASSERT_EQ(json["rebalances"].size(), 1u);
    const auto& record = json["rebalances"][0];
    EXPECT_TRUE(record["moved"].get<bool>());
    EXPECT_EQ(record["handover"], "worker to worker");
    EXPECT_EQ(record["block_costs"], "measured in the stages");
    // Every block of the model, as its stage timed it over the run since the move.
    ASSERT_EQ(json["blocks"].size(), 15u);
    for (const auto& block : json["blocks"]) {
      EXPECT_GT(block["measured_compute_s"].get<double>(), 0) << block;
    }
    // The model's parameters and Adam's moments are about 160 MiB.
    EXPECT_LT(record["master_received_mib"].get<double>(), 1.0);
    EXPECT_EQ(json["stages"][1]["blocks"], "layer3.0..head");
    ASSERT_EQ(json["epochs"].size(), 3u);
    for (size_t e = 0; e < 3; ++e) {
      for (const char* loss : {"train_loss", "val_loss"}) {
        const double want = kept_json["epochs"][e][loss].get<double>();
        EXPECT_NEAR(json["epochs"][e][loss].get<double>(), want, 1e-5 * std::abs(want))
            << loss << " of epoch " << e + 1;
      }
    }
    EXPECT_LE(largest_relative_difference(kept, read_checkpoint(latest_checkpoint(base + name))),
              1e-5);
  }
  EXPECT_EQ(
      nlohmann::json::parse(std::ifstream(base + "-within.json"))["rebalances"][0]["after_batch"],
      3);
  for (const char* suffix : {"-kept", "-between", "-within"}) {
    std::filesystem::remove_all(base + suffix);
    std::remove((base + suffix + ".json").c_str());
  }
}

// A move whose stage would not fit the memory budget (by the plan's estimate) is not made, says
// why, and training goes on with the cut it has.
TEST(Rebalance, AMoveOverTheMemoryBudgetIsRefusedAndTrainingGoesOn) {
  const std::string metrics = ferry::testing::process_temp_dir().file("refused.json");
  // Cut within layer4, each stage holds about half of the parameters (their peaks are about 150
  // and 205 MiB); moved to the head, stage 0 would hold all but the head's (estimated at 355 MiB).
  CommandResult r = run(rebalance_job(2, "layer4.1") +
                        " --rebalance-to head --memory-budget-mib 250 --metrics-file " + metrics);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("re-balance after epoch 1 not made (stage0 stem..layer4.0 -> "
                                  "stem..decoder.4, stage1 layer4.1..head -> head): stage0 "
                                  "(stem..decoder.4) on worker1 would peak at an estimated"))
      << r.output;
  EXPECT_THAT(r.output, HasSubstr("over the budget of 250 MiB per process; training goes on"));
  auto json = nlohmann::json::parse(std::ifstream(metrics));
  ASSERT_EQ(json["epochs"].size(), 2u);
  ASSERT_EQ(json["rebalances"].size(), 1u);
  EXPECT_FALSE(json["rebalances"][0]["moved"].get<bool>());
  EXPECT_EQ(json["stages"][0]["blocks"], "stem..layer4.0");
  std::remove(metrics.c_str());
}

// A cut that names no block, or makes another number of stages, is refused before training.
TEST(Rebalance, ABadCutIsRefusedBeforeTraining) {
  CommandResult unknown = run(rebalance_job() + " --rebalance-to layer9.0");
  EXPECT_NE(unknown.status, 0);
  EXPECT_THAT(unknown.output, HasSubstr("--rebalance-to layer9.0: ")) << unknown.output;
  EXPECT_THAT(unknown.output, Not(HasSubstr("epoch 1/3")));
  CommandResult three = run(rebalance_job() + " --rebalance-to layer3.0,decoder.0");
  EXPECT_NE(three.status, 0);
  EXPECT_THAT(three.output,
              HasSubstr("--rebalance-to layer3.0,decoder.0 makes 3 stages but the job has 2"))
      << three.output;
}

}  // namespace
