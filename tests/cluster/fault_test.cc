// Faults in a training world of separate processes (a ferry-master and three ferry-workers, as on
// separate hosts): a worker killed mid-training fails the job naming the worker and its stage and
// leaves the last checkpoint whole, from which training resumes; a killed master leaves no worker
// behind; a master killed while saving leaves the last checkpoint whole, and resuming from it
// follows the uninterrupted run's losses; with a spare, a killed worker's stage moves to the
// spare and the job finishes on the same losses. Every wait is bounded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "ferry/core/local_world.h"
#include "tests/cluster/job_world.h"
#include "tests/support/cluster.h"
#include "tests/support/sanitizer_allowance.h"
#include "tests/support/temp_dir.h"
#include "tests/support/training_runs.h"
#include "tests/support/wait.h"

namespace {

using Clock = std::chrono::steady_clock;
using ferry::testing::kJobTime;
using ferry::testing::Process;
using ferry::testing::read_file;
using ferry::testing::wait_until;
using ferry::testing::World;
namespace fs = std::filesystem;

const char* kJob =
    "--model unet-resnet18 --image-size 32 --samples 200 --batch-size 8 --optimizer adam";

TEST(Faults, AKilledWorkerFailsTheJobNamingItsStageAndTheCheckpointResumes) {
  World world("kill-worker", std::string(kJob) + " --epochs 50 --checkpoint-dir " +
                                 ferry::testing::process_temp_dir().file("fault-ckpt"));
  std::string ckpt = ferry::testing::process_temp_dir().file("fault-ckpt");
  ASSERT_TRUE(wait_until([&] { return fs::exists(ckpt + "/LATEST"); }, kJobTime)) << world.log();
  world.workers[1]->kill(SIGKILL);  // worker2, the decoder's
  auto killed = Clock::now();
  std::optional<int> status = world.master->wait(kJobTime);
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
  // Checkpoints are numbered from 0, one per epoch: ckpt-n holds epoch n + 1.
  int saved_epoch = std::stoi(latest.substr(5)) + 1;
  std::string epochs = std::to_string(saved_epoch + 1);
  World resumed("resume",
                std::string(kJob) + " --epochs " + epochs + " --resume --checkpoint-dir " + ckpt);
  status = resumed.master->wait(kJobTime);
  ASSERT_TRUE(status.has_value()) << resumed.log();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << resumed.log();
  EXPECT_NE(resumed.log().find("resumed from " + ckpt), std::string::npos) << resumed.log();
  EXPECT_NE(resumed.log().find("epoch " + epochs + "/" + epochs + ": train loss"),
            std::string::npos)
      << resumed.log();
  fs::remove_all(ckpt);
}

// Per-epoch losses from a --metrics-file: {epoch: {train, validation}}.
std::map<int, std::pair<double, double>> losses_in(const std::string& metrics_file) {
  std::map<int, std::pair<double, double>> out;
  std::ifstream in(metrics_file);
  if (!in) return out;
  nlohmann::json metrics = nlohmann::json::parse(in);
  for (const auto& e : metrics.at("epochs")) {
    out[e.at("epoch").get<int>()] = {e.at("train_loss").get<double>(),
                                     e.at("val_loss").get<double>()};
  }
  return out;
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// Three epochs with a checkpoint after each; with one intra-op thread per process (World sets
// OMP_NUM_THREADS=1) every run of it follows the same loss curve.
const std::string kCurveBase =
    "--model unet-resnet18 --image-size 32 --samples 80 --seed 3 --optimizer adam";
const std::string kCurveJob = kCurveBase + " --epochs 3";

// `flags` are added to kCurveJob's; `workers` hold the stages.
std::map<int, std::pair<double, double>> uninterrupted_losses(const std::string& flags = "",
                                                              int workers = 3) {
  std::string metrics = ferry::testing::process_temp_dir().file("fault-straight.json");
  World straight("straight", kCurveJob + flags + " --metrics-file " + metrics, workers);
  EXPECT_TRUE(straight.master->wait(kJobTime).has_value()) << straight.log();
  auto losses = losses_in(metrics);
  EXPECT_EQ(losses.size(), 3u) << straight.log() << read_file(metrics);
  fs::remove(metrics);
  return losses;
}

// Each epoch in `got` has the losses of the same epoch in `expected`. With one intra-op thread
// that holds to the last printed digit. With several, the first epoch after a restore differs by
// about 1e-8 and training amplifies that to 1e-4 two epochs on; a state not restored (an
// optimizer step count, a shuffle order) moves them by 1e-2 or more.
// `validation`: whether the validation losses are compared too.
void expect_same_curve(const std::map<int, std::pair<double, double>>& got,
                       const std::map<int, std::pair<double, double>>& expected,
                       bool validation = true) {
  for (const auto& [epoch, losses] : got) {
    ASSERT_TRUE(expected.count(epoch)) << "epoch " << epoch;
    EXPECT_LT(relative(losses.first, expected.at(epoch).first), 1e-6) << "epoch " << epoch;
    if (validation) {
      EXPECT_LT(relative(losses.second, expected.at(epoch).second), 1e-6) << "epoch " << epoch;
    }
    std::cout << std::setprecision(10) << "epoch " << epoch << ": train " << losses.first
              << " (uninterrupted " << expected.at(epoch).first << "), validation " << losses.second
              << " (" << expected.at(epoch).second << ")\n";
  }
}

// The number of a "ckpt-N" folder, -1 for any other name.
int checkpoint_number(const std::string& name) {
  return name.rfind("ckpt-", 0) == 0 ? std::atoi(name.c_str() + 5) : -1;
}

// The master is killed in the middle of a save: its new checkpoint folder is complete, but LATEST
// has not moved to it. A FIFO where the save writes LATEST's temporary file holds the master there
// (opening a FIFO to write waits for a reader), so the kill lands mid-save every time. LATEST
// still names the last complete checkpoint, and a new world resumed from it follows the loss curve
// of a run that was never interrupted.
TEST(Faults, AMasterKilledWhileSavingLeavesTheLastCheckpointAndResumingFollowsTheSameCurve) {
  auto expected = uninterrupted_losses();
  ASSERT_EQ(expected.size(), 3u);

  std::string ckpt = ferry::testing::process_temp_dir().file("fault-save");
  World killed("killed", kCurveJob + " --checkpoint-dir " + ckpt);
  ASSERT_TRUE(wait_until([&] { return fs::exists(ckpt + "/LATEST"); }, kJobTime,
                         std::chrono::milliseconds(1)))
      << killed.log();
  const std::string held = ckpt + "/LATEST.tmp";
  ASSERT_EQ(::mkfifo(held.c_str(), 0600), 0) << std::strerror(errno);
  // Held: a checkpoint complete beyond the one LATEST names.
  auto newest_complete = [&] {
    int newest = -1;
    for (const auto& entry : fs::directory_iterator(ckpt)) {
      if (fs::exists(entry.path() / "manifest.json")) {
        newest = std::max(newest, checkpoint_number(entry.path().filename().string()));
      }
    }
    return newest;
  };
  ASSERT_TRUE(wait_until(
      [&] { return newest_complete() > checkpoint_number(read_file(ckpt + "/LATEST")); }, kJobTime))
      << killed.log();
  killed.master->kill(SIGKILL);
  ASSERT_TRUE(killed.master->wait(std::chrono::seconds(10)).has_value());
  for (auto& w : killed.workers) ASSERT_TRUE(w->wait(std::chrono::seconds(10)).has_value());
  fs::remove(held);
  const std::string latest = read_file(ckpt + "/LATEST");
  std::cout << "killed while saving ckpt-" << newest_complete() << "; LATEST is " << latest << "\n";
  ASSERT_TRUE(fs::exists(ckpt + "/" + latest + "/manifest.json")) << latest;
  EXPECT_LT(checkpoint_number(latest), newest_complete());

  std::string resumed_metrics = ckpt + "-resumed.json";
  World resumed("resumed", kCurveJob + " --resume --checkpoint-dir " + ckpt + " --metrics-file " +
                               resumed_metrics);
  std::optional<int> status = resumed.master->wait(kJobTime);
  ASSERT_TRUE(status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << resumed.log();
  auto got = losses_in(resumed_metrics);
  ASSERT_FALSE(got.empty()) << resumed.log();
  expect_same_curve(got, expected);
  EXPECT_THAT(resumed.log(),
              ::testing::HasSubstr("after epoch " + std::to_string(checkpoint_number(latest) + 1)));
  for (const auto& entry : fs::directory_iterator(ckpt)) {
    if (entry.is_directory()) {
      EXPECT_TRUE(fs::exists(entry.path() / "manifest.json")) << entry.path();
    }
  }
}

// Tensors are restored by name and the optimizer's state is in the whole model's parameter
// order, so two epochs on two stages and a third resumed on three follow the two-stage run.
TEST(Faults, ResumingOnThreeStagesFromACheckpointWrittenOnTwoFollowsTheSameCurve) {
  auto expected = uninterrupted_losses(" --stages 2");
  ASSERT_EQ(expected.size(), 3u);
  std::string ckpt = ferry::testing::process_temp_dir().file("fault-restage");
  fs::remove_all(ckpt);
  World two("two", kCurveBase + " --epochs 2 --stages 2 --checkpoint-dir " + ckpt);
  std::optional<int> status = two.master->wait(kJobTime);
  ASSERT_TRUE(status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << two.log();

  std::string metrics = ckpt + "-three.json";
  World three("three", kCurveBase + " --epochs 3 --stages 3 --resume --checkpoint-dir " + ckpt +
                           " --metrics-file " + metrics);
  status = three.master->wait(kJobTime);
  ASSERT_TRUE(status.has_value() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << three.log();
  EXPECT_NE(three.log().find("stage2"), std::string::npos) << three.log();
  EXPECT_NE(three.log().find("resumed from " + ckpt + " after epoch 2"), std::string::npos)
      << three.log();
  auto got = losses_in(metrics);
  ASSERT_EQ(got.size(), 1u) << three.log();
  EXPECT_EQ(got.begin()->first, 3);
  expect_same_curve(got, expected);
  fs::remove_all(ckpt);
  fs::remove(metrics);
}

TEST(Faults, WorkersExitByThemselvesWhenTheMasterIsKilled) {
  World world("kill-master", std::string(kJob) + " --epochs 50");
  ASSERT_TRUE(
      wait_until([&] { return world.log().find("epoch 1/50") != std::string::npos; }, kJobTime))
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

// The events of `kind` in a --events file, in order.
std::vector<nlohmann::json> events_of(const std::string& path, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (nlohmann::json& event : ferry::testing::read_events(path)) {
    if (event.at("event") == kind) out.push_back(std::move(event));
  }
  return out;
}

// Two epochs of 8 batches, 2 to an optimizer step: 4 steps an epoch, a checkpoint after every
// third step besides each epoch's.
const std::string kStepJob =
    kCurveBase + " --epochs 2 --accumulate 2 --checkpoint-every-steps 3 --keep-checkpoints 10";

// A step checkpoint made the latest (a run that died after it): --resume goes on at the next
// batch, and every epoch's losses and the final weights are the straight run's, bit for bit.
TEST(Faults, AStepCheckpointResumesAtTheNextBatchWithTheSameLossesAndWeights) {
  const std::string ckpt = ferry::testing::process_temp_dir().file("step-ckpt");
  const std::string events = ckpt + ".events", metrics = ckpt + ".json";
  fs::remove_all(ckpt);
  fs::remove(events);
  const std::string job = kStepJob + " --checkpoint-dir " + ckpt + " --events " + events;
  {
    World straight("step-straight", job + " --metrics-file " + metrics);
    std::optional<int> status = straight.master->wait(kJobTime);
    ASSERT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << straight.log();
  }
  const auto expected = losses_in(metrics);
  ASSERT_EQ(expected.size(), 2u);
  EXPECT_EQ(events_of(events, "step").size(), 8u);
  // Where each checkpoint stands: (epochs done, batches of the next, steps).
  std::vector<std::array<int64_t, 3>> saved;
  std::string step_3;
  for (const nlohmann::json& c : events_of(events, "checkpoint")) {
    saved.push_back(
        {c.at("epoch").get<int64_t>(), c.at("batch").get<int64_t>(), c.at("step").get<int64_t>()});
    if (c.at("step") == 3) step_3 = c.at("folder");
  }
  // A step's checkpoint still waiting for the disk when a newer one comes is not written; the
  // first and each epoch's always are.
  const std::vector<std::array<int64_t, 3>> every = {{0, 6, 3}, {1, 0, 4}, {1, 4, 6}, {2, 0, 8}};
  EXPECT_THAT(saved, ::testing::IsSupersetOf({every[0], every[1], every[3]}));
  EXPECT_THAT(saved, ::testing::Each(::testing::AnyOfArray(every)));
  ASSERT_FALSE(step_3.empty());
  const ferry::testing::SavedCheckpoint straight_end =
      ferry::testing::read_checkpoint(ferry::testing::latest_checkpoint(ckpt));

  std::ofstream(ckpt + "/LATEST", std::ios::trunc) << fs::path(step_3).filename().string();
  const std::string resumed_metrics = ckpt + "-resumed.json";
  World resumed("step-resumed", job + " --resume --metrics-file " + resumed_metrics);
  std::optional<int> status = resumed.master->wait(kJobTime);
  ASSERT_TRUE(status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << resumed.log();
  EXPECT_THAT(resumed.log(), ::testing::HasSubstr("resumed from " + ckpt +
                                                  " after batch 6 of 8 of epoch 1 (optimizer "
                                                  "step 3)"));
  const auto got = losses_in(resumed_metrics);
  EXPECT_EQ(got, expected) << resumed.log();
  EXPECT_EQ(
      ferry::testing::largest_absolute_difference(
          ferry::testing::read_checkpoint(ferry::testing::latest_checkpoint(ckpt)), straight_end),
      0.0);
  // The resumed run's events follow the straight run's in the same file.
  const std::vector<nlohmann::json> resumes = events_of(events, "resume");
  ASSERT_EQ(resumes.size(), 1u);
  EXPECT_EQ(resumes[0].at("step"), 3);
  EXPECT_EQ(events_of(events, "step").size(), 8u + 5u);
  fs::remove_all(ckpt);
  fs::remove(events);
  fs::remove(metrics);
  fs::remove(resumed_metrics);
}

// With a spare, a killed worker's stage is rebuilt on the spare from the last checkpoint, and the
// job finishes by itself with the losses of a run that was never interrupted. `flags` are added
// to kCurveJob's for both runs, `broken_flags` to the run with the kill only; `workers` hold the
// stages, one more waits as the spare; worker2 is killed, and `takeover` is what the master says
// of it. `validation`: whether the validation losses must be the same too (not
// after a takeover from a replica, expect_replica_takes_over says why).
void expect_spare_takes_over(const std::string& flags, int workers = 3,
                             const std::string& takeover =
                                 "worker \"worker2\" was lost; spare "
                                 "\"worker4\" takes over stage decoder",
                             const std::string& broken_flags = "",
                             std::function<bool(const std::string& log)> ready = {},
                             bool validation = true) {
  auto expected = uninterrupted_losses(flags, workers);
  ASSERT_EQ(expected.size(), 3u);
  std::string ckpt = ferry::testing::process_temp_dir().file("fault-spare");
  std::string metrics = ckpt + ".json";
  fs::remove_all(ckpt);
  World world("spare",
              kCurveJob + flags + broken_flags + " --spares 1 --checkpoint-dir " + ckpt +
                  " --metrics-file " + metrics,
              workers + 1);
  // Into the second epoch: the checkpoint of the first is whole and a step of the second is
  // done (the progress bar prints every step of so short an epoch when it is not a terminal).
  const std::regex second_epoch_step(R"(epoch 2/3 \[[#.]*\] [1-9])");
  if (!ready) {
    ready = [&](const std::string& log) {
      return fs::exists(ckpt + "/LATEST") && std::regex_search(log, second_epoch_step);
    };
  }
  ASSERT_TRUE(
      wait_until([&] { return ready(world.log()); }, kJobTime, std::chrono::milliseconds(10)))
      << world.log();
  world.workers[1]->kill(SIGKILL);  // worker2, the decoder's
  std::optional<int> status = world.master->wait(kJobTime);
  ASSERT_TRUE(status.has_value()) << world.log();
  std::string log = world.log();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << log;
  EXPECT_NE(log.find(takeover), std::string::npos) << log;
  EXPECT_NE(log.find("training goes on from epoch"), std::string::npos) << log;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("spare") != std::string::npos || line.find("goes on") != std::string::npos) {
      std::cout << line << "\n";
    }
  }
  auto got = losses_in(metrics);
  EXPECT_EQ(got.size(), 3u) << log;
  expect_same_curve(got, expected, validation);
  for (size_t w = 0; w < world.workers.size(); ++w) {
    if (w == 1) continue;
    std::optional<int> exit = world.workers[w]->wait(std::chrono::seconds(20));
    EXPECT_TRUE(exit.has_value() && WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << "worker " << w;
  }
  fs::remove_all(ckpt);
  fs::remove(metrics);
}

TEST(Faults, ASpareTakesOverAKilledWorkersStageAndTheJobFinishesOnTheSameCurve) {
  expect_spare_takes_over("");
}

// With a checkpoint every second step, the spare goes on from the newest one the master has
// brought from the workers, in the middle of the epoch: at most four steps are trained again
// (the newest copies may be lost with their worker before they are brought here), and the curve
// is the same. The worker is killed once the job is past step 12, half way through its second
// epoch: a save waits until the checkpoint before it is brought here, so once step 13 is logged
// the checkpoint after step 10 is on the master, whatever the machine's speed.
TEST(Faults, ASpareGoesOnFromTheLastStepCheckpointInTheMiddleOfTheEpoch) {
  const std::string events = ferry::testing::process_temp_dir().file("spare-steps.events");
  fs::remove(events);
  auto within_second_epoch = [&events](const std::string&) {
    const std::vector<nlohmann::json> steps = events_of(events, "step");
    return !steps.empty() && steps.back().at("step").get<int>() >= 13;
  };
  expect_spare_takes_over("", 3,
                          "worker \"worker2\" was lost; spare \"worker4\" takes over stage decoder",
                          " --checkpoint-every-steps 2 --events " + events, within_second_epoch);
  const std::vector<nlohmann::json> takeovers = events_of(events, "takeover");
  ASSERT_EQ(takeovers.size(), 1u);
  const nlohmann::json& takeover = takeovers[0];
  EXPECT_LE(takeover.at("steps_lost").get<int>(), 4) << takeover;
  // From a step's checkpoint (unless the epoch ended before the kill reached the job).
  EXPECT_TRUE(takeover.at("batch").get<int>() > 0 || takeover.at("epoch") == 2) << takeover;
  EXPECT_EQ(events_of(events, "worker_lost").size(), 1u);
  std::cout << "takeover: " << takeovers[0] << "\n";
  fs::remove(events);
}

// The same with micro-batches in flight when the worker dies: the new pipeline runs over the
// rebuilt stages.
TEST(Faults, ASpareTakesOverInAPipelinedJobAndItFinishesOnTheSameCurve) {
  expect_spare_takes_over(" --pipeline 1f1b --microbatches 2");
}

// With two replicas, worker2 (replica 0's stage1) is killed half way through the second epoch,
// after its second step: the spare takes that stage's parameters, buffers and optimizer state
// from replica 1's stage1, every other copy keeps its own, and the interrupted step runs again
// from its batch, no step lost. The training losses are those of the uninterrupted run; the
// validation losses are not: the rebuilt copy has replica 1's batch-norm statistics, and the
// copies that survived counted the interrupted step's batch in theirs before it failed.
void expect_replica_takes_over(const std::string& flags) {
  const std::string events = ferry::testing::process_temp_dir().file("replica-takeover.events");
  fs::remove(events);
  auto mid_epoch = [&events](const std::string&) {
    const std::vector<nlohmann::json> steps = events_of(events, "step");
    return !steps.empty() && steps.back().at("epoch") == 2 && steps.back().at("batch") >= 2;
  };
  expect_spare_takes_over(" --replicas 2 --partition decoder.0" + flags, 4,
                          "worker \"worker2\" was lost; spare \"worker5\" takes over stage stage1",
                          " --events " + events, mid_epoch, /*validation=*/false);
  const std::vector<nlohmann::json> takeovers = events_of(events, "takeover");
  ASSERT_EQ(takeovers.size(), 1u);
  const nlohmann::json& takeover = takeovers[0];
  std::cout << "takeover: " << takeover << "\n";
  // After the killed worker's last step (the sixth), wherever the kill landed.
  EXPECT_GE(takeover.at("step").get<int>(), 6) << takeover;
  if (takeover.contains("not_from_replicas")) {
    // Only a kill that lands in an optimizer step, after stage0's copies stepped (a test held
    // up for most of a step), leaves no copy of stage0 as it was before it; then the job goes
    // back to the last checkpoint, and says why.
    EXPECT_THAT(takeover.at("not_from_replicas").get<std::string>(),
                ::testing::HasSubstr("no copy of stage stage0 stands as it was after optimizer "
                                     "step"))
        << takeover;
  } else {
    EXPECT_EQ(takeover.at("steps_lost"), 0) << takeover;
    EXPECT_EQ(takeover.at("from"),
              "the surviving replicas: stage stage1 of replica 0 from replica 1's, on worker "
              "\"worker4\"");
  }
  fs::remove(events);
}

TEST(Faults, ASpareInOneOfTwoReplicasTakesItsStageFromTheOtherReplicaAndNoStepIsLost) {
  expect_replica_takes_over("");
}

// Replicas whose batch norms sum their statistics over both (a Gloo group of their own, formed
// again with the spare), pipelined.
TEST(Faults, AReplicaTakesOverUnderSyncBatchnormAndNoStepIsLost) {
  expect_replica_takes_over(" --pipeline gpipe --microbatches 2 --sync-batchnorm");
}

// A cut balanced by memory into four stages, whose skips go from stage 0 straight to stage 3
// through portals: the rebuilt stage gets its portals again.
TEST(Faults, ASpareTakesOverInAFourStageCutWithPortalsAndItFinishesOnTheSameCurve) {
  expect_spare_takes_over(" --stages 4 --balance memory", 4,
                          "worker \"worker2\" was lost; spare \"worker5\" takes over stage stage1");
}

// 1F1B whose stages recompute their activations in the backward.
TEST(Faults, ASpareTakesOverIn1F1BWithRecomputationAndItFinishesOnTheSameCurve) {
  expect_spare_takes_over(" --pipeline 1f1b --microbatches 2 --checkpoint-activations");
}

}  // namespace
