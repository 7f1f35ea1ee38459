// What the training job makes of its settings before any process starts: refusals naming the flag,
// the loss's place, the plan's settings from the schedule, the monitor, and where stages go and
// who takes over a lost worker. No world, no stage: pure logic.
#include "trainer/train_setup.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/error_of.h"
#include "trainer/placement.h"

namespace ferry::trainer {
namespace {

using ferry::testing::kind_and_error_of;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Each refusal is InvalidArgument, names the flag and says what would do.
TEST(TrainSetup, SettingsThatCannotWorkAreRefusedNamingTheFlag) {
  auto refusal = [](auto change) {
    TrainSettings s;
    change(s);
    return kind_and_error_of([&] { check_settings(s); });
  };
  EXPECT_EQ(refusal([](TrainSettings&) {}), "no error");
  EXPECT_THAT(refusal([](TrainSettings& s) { s.loss = "lovasz"; }),
              HasSubstr("InvalidArgument: --loss: unknown loss \"lovasz\""));
  EXPECT_THAT(refusal([](TrainSettings& s) { s.accumulate = 0; }),
              HasSubstr("--accumulate must be 1 or more, not 0"));
  EXPECT_THAT(refusal([](TrainSettings& s) { s.replicas = 0; }),
              HasSubstr("--replicas must be 1 or more, not 0"));
  EXPECT_THAT(refusal([](TrainSettings& s) { s.plan.model = "unet-vgg16"; }),
              HasSubstr("unet-vgg16"));
  EXPECT_THAT(refusal([](TrainSettings& s) {
                s.sync_batchnorm = true;
                s.via_master = true;
              }),
              HasSubstr("--sync-batchnorm needs pipelined steps"));
  EXPECT_THAT(refusal([](TrainSettings& s) {
                s.sync_batchnorm = true;
                s.replicas = 2;
                s.pipeline = pipeline::Schedule::OneFOneB;
              }),
              HasSubstr("use --pipeline gpipe"));
  EXPECT_THAT(refusal([](TrainSettings& s) {
                s.sync_batchnorm = true;
                s.replicas = 2;
                s.pipeline = pipeline::Schedule::ZeroBubble;
              }),
              HasSubstr("--replicas and --pipeline zb: under zb a stage's forwards"));
  EXPECT_THAT(refusal([](TrainSettings& s) {
                s.sync_batchnorm = true;
                s.freeze_batchnorm = true;
              }),
              HasSubstr("--sync-batchnorm with --freeze-batchnorm"));
}

// Classes, losses and labels that cannot work together: each refusal names the flag.
TEST(TrainSetup, ClassesLossesAndLabelsThatDisagreeAreRefused) {
  auto refusal = [](auto change) {
    TrainSettings s;
    s.plan.classes = 3;
    change(s);
    return kind_and_error_of([&] { check_settings(s); });
  };
  EXPECT_EQ(refusal([](TrainSettings&) {}), "no error");
  EXPECT_THAT(refusal([](TrainSettings& s) { s.loss = "bce"; }),
              HasSubstr("--loss bce compares one logit per pixel with masks of 0 and 1; with "
                        "--classes 3 use ce, dice, focal or ce+dice"));
  EXPECT_THAT(refusal([](TrainSettings& s) {
                s.plan.classes = 1;
                s.loss = "ce";
              }),
              HasSubstr("--loss ce needs --classes 2 or more"));
  EXPECT_THAT(refusal([](TrainSettings& s) {
                s.class_weights = {1, 2};
              }),
              HasSubstr("--class-weights has 2 values for --classes 3"));
  EXPECT_THAT(refusal([](TrainSettings& s) {
                s.loss = "focal";
                s.class_weights = {1, 2, 3};
              }),
              HasSubstr("the loss \"focal\" takes no class weights"));
  EXPECT_THAT(refusal([](TrainSettings& s) { s.ignore_index = 2; }),
              HasSubstr("--ignore-index 2 is the id of one of the classes (0 to 2)"));
  EXPECT_THAT(refusal([](TrainSettings& s) { s.plan.classes = 5; }),
              HasSubstr("--classes 5: the synthetic set has 1 class"));
  EXPECT_THAT(refusal([](TrainSettings& s) {
                s.class_names = {"a", "b"};
              }),
              HasSubstr("--class-names names 2 classes, but --classes 3 counts 3"));
}

TEST(TrainSetup, TheLossTravelsWithItsOptionsAndDefaultsByTheClasses) {
  TrainSettings s;
  EXPECT_EQ(loss_spec(s), "bce+dice");
  s.plan.classes = 4;
  EXPECT_EQ(loss_spec(s), "ce+dice");
  s.ignore_index = 255;
  s.class_weights = {0.5, 1, 1, 2};
  EXPECT_EQ(loss_spec(s), "ce+dice;ignore_index=255;class_weights=0.5,1,1,2");
  EXPECT_THAT(class_names_of(s), ElementsAre("background", "ellipse", "polygon", "ring"));
  s.data_dir = "/no/such/folder";
  EXPECT_THAT(class_names_of(s), ElementsAre("class0", "class1", "class2", "class3"));
  s.class_names = {"sky", "road", "car", "tree"};
  EXPECT_THAT(class_names_of(s), ElementsAre("sky", "road", "car", "tree"));
}

TEST(TrainSetup, TheLossIsOnTheLastStageInPipelinedStepsUnlessTheSettingsSayElse) {
  TrainSettings s;
  EXPECT_TRUE(loss_on_last_stage(s, /*pipelined=*/true));
  EXPECT_FALSE(loss_on_last_stage(s, /*pipelined=*/false));
  s.loss_on = LossPlacement::LastStage;
  EXPECT_TRUE(loss_on_last_stage(s, false));
  s.via_master = true;  // the activations come through the master anyway
  EXPECT_FALSE(loss_on_last_stage(s, false));
  s.via_master = false;
  s.loss_on = LossPlacement::Master;
  EXPECT_FALSE(loss_on_last_stage(s, true));
}

TEST(TrainSetup, ThePlansSettingsFollowTheSchedule) {
  TrainSettings s;
  s.plan.batch_size = 32;
  s.plan.stages = 4;
  s.microbatches = 8;
  s.pipeline = pipeline::Schedule::GPipe;
  EXPECT_EQ(plan_settings_of(s).in_flight_samples, 32);  // every micro-batch's activations
  s.pipeline = pipeline::Schedule::OneFOneB;
  s.checkpoint_activations = true;
  PlanSettings p = plan_settings_of(s);
  EXPECT_EQ(p.in_flight_samples, 16);  // four stages: four micro-batches of four images
  EXPECT_EQ(p.microbatches, 8);
  EXPECT_TRUE(p.recompute);
  s.plan.partition = "layer3.0";  // two stages, whatever --stages says
  EXPECT_EQ(plan_settings_of(s).in_flight_samples, 8);
  EXPECT_EQ(plan_settings_of(s).deferred_samples, 0);
  // As many, those whose weight pass waits counted; each stage of two keeps one micro-batch's
  // activations for its weight pass, recomputed or not.
  s.pipeline = pipeline::Schedule::ZeroBubble;
  EXPECT_EQ(plan_settings_of(s).in_flight_samples, 8);
  EXPECT_EQ(plan_settings_of(s).deferred_samples, 4);
  s.plan.partition = "layer2.0,layer3.0,layer4.0";  // four stages: the first waits for three
  EXPECT_EQ(plan_settings_of(s).in_flight_samples, 16);
  EXPECT_EQ(plan_settings_of(s).deferred_samples, 12);
}

TEST(StageMemory, TheZeroBubbleScheduleHoldsTheActivationsItsWeightPassesWait) {
  // One micro-batch of 4 in flight and, under the zero-bubble schedule, one more waiting on a
  // last stage: a recomputing stage holds that one's activations too.
  EXPECT_EQ(deferred_samples(32, 8, 2, 1), 4);
  EXPECT_EQ(deferred_samples(32, 8, 4, 0), 12);
  EXPECT_EQ(deferred_samples(32, 8, 4, 2), 4);
  EXPECT_EQ(deferred_samples(32, 1, 4, 3), 0);   // one micro-batch: nothing waits
  EXPECT_EQ(deferred_samples(32, 2, 4, 0), 16);  // at most all micro-batches but one
  StageMemoryTerms t;
  t.parameter_bytes = 10;  // small beside the activations: the backward is the peak
  t.state_bytes = 20;
  t.activation_bytes_per_sample = 10;
  t.working_bytes_per_sample = 12;
  const double one_f_one_b = t.peak_bytes(4, 4, true, true);
  EXPECT_DOUBLE_EQ(one_f_one_b, 10 + 20 + 10 + 12 * 4);
  EXPECT_DOUBLE_EQ(t.peak_bytes(8, 4, true, true, 4), one_f_one_b + 10 * 4);
  // Without recomputation the waiting micro-batch is one of those held.
  EXPECT_DOUBLE_EQ(t.peak_bytes(8, 4, true, false, 4), 10 + 20 + 10 + 10 * 4 + 12 * 4);
}

TEST(TrainSetup, TheOptimizerAndScheduleComeFromTheirSettings) {
  TrainSettings s;
  s.plan.optimizer = Optimizer::Sgd;
  s.lr = 0.1;
  EXPECT_EQ(optimizer_spec(s).name, "sgd");
  EXPECT_EQ(optimizer_spec(s).options.at("momentum"), 0.9);
  s.plan.optimizer = Optimizer::AdamW;
  EXPECT_EQ(optimizer_spec(s).name, "adamw");
  s.lr_schedule = dist_autograd::LrSchedule::Kind::Cosine;
  EXPECT_DOUBLE_EQ(schedule_of(s, 10).lr_at(0), 0.1);
  EXPECT_LT(schedule_of(s, 10).lr_at(9), 0.1);
  s.warmup_steps = 10;
  EXPECT_THAT(kind_and_error_of([&] { schedule_of(s, 10); }),
              HasSubstr("InvalidArgument: --lr-schedule: 10 warm-up steps leave none"));
}

TEST(TrainSetup, AMonitorOnlyWhenAskedForAndTheBestCheckpointNeedsAFolder) {
  TrainSettings s;
  EXPECT_FALSE(monitor_of(s).has_value());
  s.early_stop_patience = 3;
  std::optional<EpochMonitor> monitor = monitor_of(s);
  ASSERT_TRUE(monitor.has_value());
  EXPECT_EQ(monitor->metric(), Monitor::ValLoss);
  EXPECT_EQ(monitor->patience(), 3);
  s.monitor = Monitor::ValIou;
  EXPECT_EQ(monitor_of(s)->metric_name(), "val_iou");
  s.save_best = true;
  EXPECT_THAT(kind_and_error_of([&] { monitor_of(s); }),
              HasSubstr("--save-best needs --checkpoint-dir"));
  s.checkpoint_dir = "/tmp/unused";
  EXPECT_TRUE(monitor_of(s).has_value());
}

StagePlan three_stages() {
  StagePlan plan;
  for (const char* name : {"encoder", "decoder", "head"}) {
    PlannedStage stage;
    stage.name = name;
    plan.stages.push_back(stage);
  }
  return plan;
}

const std::vector<std::string> kWorld = {"master", "worker1", "worker2", "worker3", "worker4"};

// --memory-budget-mib: one bound for every rank, or one per worker by rank with none for the
// master; anything else refused naming the value.
TEST(TrainSetup, AMemoryBudgetIsOneForEveryRankOrOnePerWorker) {
  const MemoryBudget every = MemoryBudget::parse("300");
  EXPECT_FALSE(every.per_worker());
  EXPECT_EQ(every.of_rank(0), 300);
  EXPECT_EQ(every.of_rank(7), 300);
  const MemoryBudget each = MemoryBudget::parse("300,160,200");
  EXPECT_TRUE(each.per_worker());
  EXPECT_EQ(each.of_rank(0), 0);
  EXPECT_EQ(each.of_rank(1), 300);
  EXPECT_EQ(each.of_rank(2), 160);
  EXPECT_EQ(each.of_rank(3), 200);
  EXPECT_EQ(each.of_rank(4), 0);
  EXPECT_EQ(each.largest(), 300);
  EXPECT_EQ(each.text(), "300,160,200");
  EXPECT_TRUE(MemoryBudget{}.none());
  EXPECT_EQ(MemoryBudget{}.of_rank(1), 0);
  for (const char* bad : {"", "0", "-5", "300,", ",300", "300,,160", "3e2", "300 MiB", "x"}) {
    EXPECT_THROW(MemoryBudget::parse(bad), std::invalid_argument) << bad;
  }
  EXPECT_THAT(ferry::testing::error_of([] { MemoryBudget::parse("300,abc"); }),
              HasSubstr("\"abc\" is not a whole number of MiB"));
}

TEST(Placement, StagesGoRoundRobinOverEachReplicasWorkersAndSparesWait) {
  StagePlan plan = three_stages();
  EXPECT_THAT(place_stages(plan, "", 0, 1, kWorld), ElementsAre("worker1", "worker2", "worker3"));
  // The last rank waits as a spare; two replicas share the other four workers.
  EXPECT_THAT(place_stages(plan, "", 1, 1, kWorld), ElementsAre("worker1", "worker2", "worker3"));
  EXPECT_THAT(replica_stage_names(plan, 2),
              ElementsAre("encoder", "decoder", "head", "encoder@1", "decoder@1", "head@1"));
  EXPECT_THAT(place_stages(plan, "", 0, 2, kWorld),
              ElementsAre("worker1", "worker2", "worker1", "worker3", "worker4", "worker3"));
  // A world of one: the master hosts every stage.
  EXPECT_THAT(place_stages(plan, "", 0, 1, {"master"}), ElementsAre("master", "master", "master"));
  // --placement moves stages by name, onto a device too.
  EXPECT_THAT(place_stages(plan, "head=master,encoder@1=worker2/cuda:1", 0, 2, kWorld),
              ElementsAre("worker1", "worker2", "master", "worker2/cuda:1", "worker4", "worker3"));
}

TEST(Placement, PlacementsThatCannotBeAreRefusedNamingWhy) {
  StagePlan plan = three_stages();
  EXPECT_THAT(kind_and_error_of([&] { place_stages(plan, "", 4, 1, kWorld); }),
              HasSubstr("--spares 4 leaves no worker for the stages in a world of 5"));
  EXPECT_THAT(kind_and_error_of([&] { place_stages(plan, "", 2, 3, kWorld); }),
              HasSubstr("--replicas 3 needs a worker of its own for each replica at least; the "
                        "world has 2 besides the master and the 2 spares"));
  EXPECT_THAT(kind_and_error_of([&] { place_stages(plan, "tail=worker1", 0, 1, kWorld); }),
              HasSubstr("--placement: \"tail=worker1\" is not stage=worker with a stage among "
                        "encoder, decoder, head"));
  EXPECT_THAT(kind_and_error_of([&] { place_stages(plan, "head=worker9", 0, 1, kWorld); }),
              HasSubstr("--placement: \"head=worker9\" names no worker of the world (master, "
                        "worker1, worker2, worker3, worker4)"));
}

TEST(Placement, ASpareTakesEveryStageOfALostWorkerAndKeepsItsDevice) {
  const std::vector<std::string> names = {"encoder", "decoder", "head", "encoder@1"};
  std::vector<std::string> workers = {"worker1", "worker2/cuda:0", "worker2", "worker3"};
  std::vector<std::string> spares = {"worker4", "worker5"};
  // Nobody lost, or only a worker that held no stage: nothing to do.
  EXPECT_TRUE(take_over_lost_workers(names, workers, spares, {}).empty());
  EXPECT_TRUE(take_over_lost_workers(names, workers, spares, {"worker5"}).empty());
  const std::vector<TakenOver> taken = take_over_lost_workers(names, workers, spares, {"worker2"});
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].lost, "worker2");
  EXPECT_EQ(taken[0].spare, "worker4");
  EXPECT_THAT(taken[0].stages, ElementsAre("decoder", "head"));
  EXPECT_EQ(taken[0].describe(),
            "worker \"worker2\" was lost; spare \"worker4\" takes over stage decoder, head");
  EXPECT_THAT(workers, ElementsAre("worker1", "worker4/cuda:0", "worker4", "worker3"));
  EXPECT_THAT(spares, ElementsAre("worker5"));
  // Two lost, one spare left: no take-over; the job fails instead.
  EXPECT_TRUE(take_over_lost_workers(names, workers, spares, {"worker1", "worker3"}).empty());
  EXPECT_THAT(spares, ElementsAre("worker5"));
}

}  // namespace
}  // namespace ferry::trainer
