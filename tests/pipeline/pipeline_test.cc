// Pipelined steps across real worker processes: gradients against the full batch in one process
// for every schedule and micro-batch count, the bytes through the master, activation memory and
// the order of work under each schedule, failures, and the trace.
#include "ferry/pipeline/pipeline.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "ferry/dist_autograd/context.h"
#include "ferry/models/compare.h"
#include "tests/support/cluster.h"
#include "tests/support/error_of.h"
#include "tests/support/test_stages.h"

namespace ferry::pipeline {
namespace {

using testing::error_of;
using testing::LocalWorld;
using testing::mlp_config;

LocalWorld::Settings three_workers() {
  LocalWorld::Settings settings;
  settings.peer_names = {"a", "b", "c"};
  return settings;
}

// Micro-batches whose forward is kept, or parked, on `worker`, over all pipelines.
int64_t kept_on(const char* worker) {
  return rpc::rpc_sync(worker, "ferry.pipeline.kept", {}).toInt();
}

// Three MLP stages (no batch norm, no dropout) on workers a, b and c: in -> width -> width -> 1.
struct Chain {
  std::vector<remote_module::StageConfig> configs;
  std::vector<remote_module::RemoteModule> stages;

  Chain(int64_t in, int64_t width) {
    configs = {mlp_config(in, width, width, 1), mlp_config(width, width, width, 2),
               mlp_config(width, width, 1, 3)};
    const char* workers[] = {"a", "b", "c"};
    for (size_t s = 0; s < configs.size(); ++s) {
      stages.push_back(remote_module::RemoteModule::create(workers[s], "test.mlp", configs[s]));
    }
  }

  std::vector<rpc::RRefPtr> parameters() const {
    std::vector<rpc::RRefPtr> out;
    for (const remote_module::RemoteModule& stage : stages) {
      for (auto& p : stage.remote_parameters()) out.push_back(p);
    }
    return out;
  }

  // The full batch through the same weights in this process: loss and parameter gradients.
  std::pair<double, std::vector<at::Tensor>> reference(const at::Tensor& x,
                                                       const at::Tensor& y) const {
    std::vector<std::unique_ptr<remote_module::Stage>> local;
    for (size_t s = 0; s < stages.size(); ++s) {
      local.push_back(testing::make_local_stage("test.mlp", configs[s], stages[s].state_dict()));
    }
    c10::IValue h = x;
    for (auto& stage : local) h = stage->forward({h});
    at::Tensor loss = torch::mse_loss(h.toTensor(), y);
    loss.backward();
    std::vector<at::Tensor> grads;
    for (auto& stage : local) {
      for (auto& [name, p] : stage->named_parameters()) grads.push_back(p.grad());
    }
    return {loss.item<double>(), grads};
  }
};

// 16 samples for `chain`, and the full batch's loss and gradients through it in one process.
struct FullBatch {
  at::Tensor x, y;
  double loss = 0;
  std::vector<at::Tensor> grads;
  explicit FullBatch(const Chain& chain) {
    torch::manual_seed(7);
    x = torch::randn({16, 6});
    y = torch::randn({16, 1});
    std::tie(loss, grads) = chain.reference(x, y);
  }
};

at::Tensor mse(const at::Tensor& out, const at::Tensor& target) {
  return torch::mse_loss(out, target);
}

PipelineOptions options(Schedule schedule, int microbatches, std::vector<int> checkpoint = {}) {
  PipelineOptions o;
  o.schedule = schedule;
  o.microbatches = microbatches;
  o.checkpoint_stages = std::move(checkpoint);
  return o;
}

TEST(Pipeline, GradientsEqualTheFullBatchForEveryScheduleAndMicroBatchCount) {
  LocalWorld world(three_workers());
  Chain chain(6, 16);
  const FullBatch batch(chain);
  const at::Tensor &x = batch.x, &y = batch.y;
  const double want_loss = batch.loss;
  const std::vector<at::Tensor>& want = batch.grads;
  auto params = chain.parameters();
  struct Case {
    Schedule schedule;
    int microbatches;
    std::vector<int> checkpoint;
  };
  std::vector<Case> cases;
  for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB, Schedule::ZeroBubble}) {
    for (int m : {1, 2, 4, 8}) cases.push_back({schedule, m, {}});
    cases.push_back({schedule, 4, {0, 1, 2}});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} M={} checkpointed stages {}", schedule_name(c.schedule),
                             c.microbatches, c.checkpoint.size()));
    Pipeline pipe(chain.stages, options(c.schedule, c.microbatches, c.checkpoint));
    dist_autograd::Context context;
    Pipeline::StepResult result = pipe.step(x, y, mse);
    EXPECT_NEAR(result.loss, want_loss, 1e-5 * std::abs(want_loss));
    EXPECT_EQ(result.output.sizes(), (std::vector<int64_t>{16, 1}));
    EXPECT_LE(models::max_relative_error(dist_autograd::get_gradients(context.id(), params), want),
              1e-5);
    // Nothing stays behind on the workers once every backward ran.
    for (const char* worker : {"a", "b", "c"}) EXPECT_EQ(kept_on(worker), 0) << worker;
  }
}

// A recomputed stage runs its forward twice, but its batch norms' running statistics take each
// micro-batch once, as a stage that keeps its activations does.
TEST(Pipeline, RecomputedStagesMoveTheirRunningStatisticsOnce) {
  LocalWorld world(three_workers());
  auto chain_with_batchnorm = [] {
    std::vector<remote_module::RemoteModule> stages;
    const char* workers[] = {"a", "b", "c"};
    for (int64_t s = 0; s < 3; ++s) {
      remote_module::StageConfig config = mlp_config(s == 0 ? 6 : 8, 8, s == 2 ? 1 : 8, s + 1);
      config.insert("batchnorm", int64_t{1});
      stages.push_back(remote_module::RemoteModule::create(workers[s], "test.mlp", config));
    }
    return stages;
  };
  std::vector<remote_module::RemoteModule> kept = chain_with_batchnorm();
  std::vector<remote_module::RemoteModule> recomputed = chain_with_batchnorm();
  torch::manual_seed(7);
  const at::Tensor x = torch::randn({16, 6}), y = torch::randn({16, 1});
  for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB}) {
    for (auto* stages : {&kept, &recomputed}) {
      Pipeline pipe(
          *stages,
          options(schedule, 4, stages == &kept ? std::vector<int>{} : std::vector<int>{0, 1, 2}));
      dist_autograd::Context context;
      pipe.step(x, y, mse);
    }
  }
  for (size_t s = 0; s < 3; ++s) {
    auto want = kept[s].state_dict();
    for (const auto& entry : recomputed[s].state_dict()) {
      EXPECT_TRUE(torch::allclose(entry.value(), want.at(entry.key()), 1e-6, 1e-6))
          << "stage " << s << " " << entry.key() << ": " << entry.value() << " against "
          << want.at(entry.key());
    }
  }
}

PipelineOptions with_stage_loss(PipelineOptions o, const std::string& loss = "test.mse") {
  o.loss = loss;
  return o;
}

// The last stage computes the loss from its output and the targets the master sent it, and starts
// each backward itself: the same loss and gradients as the master computing it, for each schedule,
// with recomputed stages too, and with the loss scaled as when batches accumulate.
TEST(Pipeline, TheLossOnTheLastStageGivesTheSameLossAndGradients) {
  LocalWorld world(three_workers());
  Chain chain(6, 16);
  const FullBatch batch(chain);
  const at::Tensor &x = batch.x, &y = batch.y;
  const double want_loss = batch.loss;
  const std::vector<at::Tensor>& want = batch.grads;
  auto params = chain.parameters();
  for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB, Schedule::ZeroBubble}) {
    for (int m : {1, 3, 8}) {
      for (bool recompute : {false, true}) {
        SCOPED_TRACE(fmt::format("{} M={} recompute {}", schedule_name(schedule), m, recompute));
        std::vector<int> checkpoint;
        if (recompute) checkpoint = {0, 1, 2};
        Pipeline pipe(chain.stages, with_stage_loss(options(schedule, m, checkpoint)));
        for (double scale : {1.0, 0.25}) {
          dist_autograd::Context context;
          Pipeline::StepResult result = pipe.step(x, y, scale);
          EXPECT_NEAR(result.loss, want_loss, 1e-5 * std::abs(want_loss));
          EXPECT_FALSE(result.output.defined());
          std::vector<at::Tensor> scaled;
          for (const at::Tensor& g : want) scaled.push_back(g * scale);
          EXPECT_LE(models::max_relative_error(dist_autograd::get_gradients(context.id(), params),
                                               scaled),
                    1e-5);
        }
        for (const char* worker : {"a", "b", "c"}) EXPECT_EQ(kept_on(worker), 0) << worker;
      }
    }
  }
}

TEST(Pipeline, ALossTheLastStageCannotComputeIsAClearError) {
  LocalWorld world(three_workers());
  Chain chain(6, 8);
  // Not registered on the last stage's worker: refused when the pipeline is set up.
  std::string unknown = error_of(
      [&] { Pipeline(chain.stages, with_stage_loss(options(Schedule::GPipe, 2), "lovasz")); });
  EXPECT_NE(unknown.find("pipeline stage 2 (\"test.mlp\") on worker \"c\" cannot take part"),
            std::string::npos)
      << unknown;
  EXPECT_NE(unknown.find("unknown loss \"lovasz\""), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("test.mse"), std::string::npos) << unknown;

  Pipeline pipe(chain.stages, with_stage_loss(options(Schedule::OneFOneB, 2)));
  at::Tensor x = torch::randn({4, 6});
  auto context = std::make_unique<dist_autograd::Context>();
  EXPECT_NE(error_of([&] {
              pipe.step(x, torch::randn({4, 1}), mse);
            }).find("last stage computes the loss (\"test.mse\")"),
            std::string::npos);
  // Targets the loss cannot take: the error names the micro-batch, the stage and its worker,
  // and the next step starts clean.
  std::string bad = error_of([&] { pipe.step(x, torch::randn({4, 3, 2}), 1.0); });
  context.reset();
  EXPECT_NE(bad.find("forward of micro-batch "), std::string::npos) << bad;
  EXPECT_NE(bad.find(" at stage 2 (\"test.mlp\") on worker \"c\""), std::string::npos) << bad;
  for (const char* worker : {"a", "b", "c"}) EXPECT_EQ(kept_on(worker), 0) << worker;
  context = std::make_unique<dist_autograd::Context>();
  EXPECT_GT(pipe.step(x, torch::randn({4, 1}), 1.0).loss, 0);
  Pipeline plain(chain.stages, options(Schedule::GPipe, 2));
  EXPECT_NE(error_of([&] {
              plain.step(x, torch::randn({4, 1}), 1.0);
            }).find("computes no loss (PipelineOptions::loss is empty)"),
            std::string::npos);
}

// Each stage runs its micro-batches' forwards, and backwards, in micro-batch order whatever order
// the requests arrive in, so gradients summed over eight micro-batches come out the same to the
// bit every time (and batch norm's running statistics would too).
TEST(Pipeline, MicroBatchesRunInOrderSoARepeatedStepGivesTheSameBits) {
  LocalWorld world(three_workers());
  Chain chain(6, 16);
  torch::manual_seed(11);
  at::Tensor x = torch::randn({64, 6});
  at::Tensor y = torch::randn({64, 1});
  auto params = chain.parameters();
  for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB, Schedule::ZeroBubble}) {
    SCOPED_TRACE(schedule_name(schedule));
    Pipeline pipe(chain.stages, options(schedule, 8));
    std::vector<at::Tensor> first;
    for (int run = 0; run < 8; ++run) {
      dist_autograd::Context context;
      pipe.step(x, y, mse);
      std::vector<at::Tensor> grads = dist_autograd::get_gradients(context.id(), params);
      if (run == 0) {
        first = grads;
        continue;
      }
      ASSERT_EQ(grads.size(), first.size());
      for (size_t i = 0; i < grads.size(); ++i) {
        EXPECT_TRUE(torch::equal(grads[i], first[i])) << "run " << run << ", parameter " << i;
      }
    }
  }
}

TEST(Pipeline, TheMasterSendsOnlyInputsAndReceivesOnlyOutputs) {
  LocalWorld world(three_workers());
  // 64 samples of 4 numbers in, one number each out; between stages 64 x 2048 floats (512 KiB).
  Chain chain(4, 2048);
  at::Tensor x = torch::randn({64, 4});
  at::Tensor y = torch::randn({64, 1});
  for (bool loss_on_stage : {false, true}) {
    SCOPED_TRACE(loss_on_stage ? "loss on the last stage" : "loss on the master");
    PipelineOptions o = options(Schedule::OneFOneB, 4);
    if (loss_on_stage) o = with_stage_loss(o);
    Pipeline pipe(chain.stages, o);
    dist_autograd::Context context;
    std::uint64_t sent = world.master().bytes_sent();
    std::uint64_t received = world.master().bytes_received();
    if (loss_on_stage) {
      pipe.step(x, y);
    } else {
      pipe.step(x, y, mse);
    }
    sent = world.master().bytes_sent() - sent;
    received = world.master().bytes_received() - received;
    // Inputs (1 KiB) and targets or output gradients (256 B) out; losses or outputs (256 B),
    // answers and the stages' events in; a few hundred bytes of envelope per message. One
    // activation is 512 KiB.
    EXPECT_LT(sent, 16u << 10) << sent;
    EXPECT_LT(received, 16u << 10) << received;
  }
}

// The most micro-batches stage `s` held at once between a forward and the end of its weight pass
// (its last weight span), from the timeline of zero-bubble steps.
int most_held_to_weight_pass(const Timeline& timeline, int s) {
  std::map<std::pair<int, int>, double> weighed;  // (step, micro-batch): its last weight span's end
  std::vector<std::pair<double, int>> changes;    // (when, +1 or -1)
  for (const Span& span : timeline.spans()) {
    if (span.track != Timeline::compute_track(s)) continue;
    if (span.kind == SpanKind::Forward) changes.emplace_back(span.start_s, 1);
    if (span.kind == SpanKind::Weight) {
      double& end = weighed[{span.step, span.microbatch}];
      end = std::max(end, span.end_s);
    }
  }
  for (const auto& [microbatch, end] : weighed) changes.emplace_back(end, -1);
  std::sort(changes.begin(), changes.end());  // at one instant, a -1 before a +1
  int held = 0, most = 0;
  for (const auto& [when, change] : changes) most = std::max(most, held += change);
  return most;
}

// Under 1F1B stage s holds at most p - s micro-batches; under zb too, those whose weight pass waits
// counted, but for one on the last stage (from the timeline: what a micro-batch holds in bytes is
// the allocator's difference over its forward, which other threads' allocations move by a tensor or
// so).
TEST(Pipeline, OneFOneBKeepsFewerActivationsThanGPipeAndZeroBubbleNoMore) {
  LocalWorld world(three_workers());
  // Many samples through small layers, so that activations (512 x 128 floats a tensor per
  // micro-batch) outweigh the parameters' gradients (128 x 128 floats a layer).
  Chain chain(32, 128);
  at::Tensor x = torch::randn({4096, 32});
  at::Tensor y = torch::randn({4096, 1});
  std::map<Schedule, std::vector<Pipeline::StageMemory>> peaks;
  for (Schedule schedule : {Schedule::GPipe, Schedule::OneFOneB, Schedule::ZeroBubble}) {
    Pipeline pipe(chain.stages, options(schedule, 8));
    dist_autograd::Context context;
    pipe.step(x, y, mse);
    peaks[schedule] = pipe.memory_peaks();
    // The order each stage ran its micro-batches in (under zb, B is the input pass).
    for (int s = 0; s < 3; ++s) {
      std::string order;
      for (const auto& span : pipe.timeline().spans()) {
        if (span.track != pipeline::Timeline::compute_track(s)) continue;
        if (span.kind == pipeline::SpanKind::Forward) order += "F";
        if (span.kind == pipeline::SpanKind::Backward) order += "B";
      }
      SCOPED_TRACE(fmt::format("{} stage {}: {}", schedule_name(schedule), s, order));
      if (schedule == Schedule::GPipe) {
        EXPECT_EQ(order, "FFFFFFFFBBBBBBBB");
        continue;
      }
      // Stage s never holds more than p - s micro-batches between forward and backward, and
      // ends as it began.
      int held = 0, most = 0;
      for (char c : order) most = std::max(most, held += c == 'F' ? 1 : -1);
      EXPECT_LE(most, 3 - s);
      EXPECT_EQ(held, 0);
      if (schedule == Schedule::OneFOneB) {
        EXPECT_EQ(most, 3 - s);
        EXPECT_EQ(order.substr(0, 3 - s), std::string(3 - s, 'F'));
      } else {
        // The last stage's one place, and one micro-batch whose weight pass waits.
        EXPECT_LE(most_held_to_weight_pass(pipe.timeline(), s), s == 2 ? 2 : 3 - s);
      }
    }
  }
  for (int s = 0; s < 3; ++s) {
    const auto& gpipe = peaks[Schedule::GPipe][s];
    const auto& one_f_one_b = peaks[Schedule::OneFOneB][s];
    const auto& zero_bubble = peaks[Schedule::ZeroBubble][s];
    SCOPED_TRACE(
        fmt::format("stage {}: activations gpipe {:.2f} MiB, 1f1b {:.2f} MiB, zb {:.2f} MiB; all "
                    "tensors gpipe {:.2f} MiB, 1f1b {:.2f} MiB, zb {:.2f} MiB",
                    s, gpipe.activation_mib, one_f_one_b.activation_mib, zero_bubble.activation_mib,
                    gpipe.tensor_mib, one_f_one_b.tensor_mib, zero_bubble.tensor_mib));
    // 8 micro-batches at once against at most 3 - s.
    EXPECT_GT(gpipe.activation_mib, 0);
    EXPECT_LT(one_f_one_b.activation_mib, 0.5 * gpipe.activation_mib);
    EXPECT_LT(one_f_one_b.tensor_mib, gpipe.tensor_mib);
    EXPECT_LT(zero_bubble.activation_mib, 0.5 * gpipe.activation_mib);
  }
}

// The zero-bubble schedule defers every micro-batch's weight pass, and the weight passes fill
// what 1F1B leaves idle. Two stages whose passes each take milliseconds; the step's timing is
// this machine's, so each schedule gets three tries and the best is compared.
TEST(Pipeline, TheZeroBubbleSchedulesBubbleIsBelowOneFOneBsAtEightMicroBatches) {
  LocalWorld::Settings settings;
  settings.peer_names = {"a", "b"};
  settings.env = {{"OMP_NUM_THREADS", "1"}};
  LocalWorld world(settings);
  std::vector<remote_module::RemoteModule> stages = {
      remote_module::RemoteModule::create("a", "test.mlp", mlp_config(256, 512, 256, 1)),
      remote_module::RemoteModule::create("b", "test.mlp", mlp_config(256, 512, 1, 2))};
  at::Tensor x = torch::randn({2048, 256});
  at::Tensor y = torch::randn({2048, 1});
  std::map<Schedule, double> best{{Schedule::OneFOneB, 1.0}, {Schedule::ZeroBubble, 1.0}};
  for (int attempt = 0; attempt < 3 && !(best[Schedule::ZeroBubble] < best[Schedule::OneFOneB]);
       ++attempt) {
    for (Schedule schedule : {Schedule::OneFOneB, Schedule::ZeroBubble}) {
      Pipeline pipe(stages, options(schedule, 8));
      for (int step = 0; step < 3; ++step) {
        dist_autograd::Context context;
        pipe.step(x, y, mse);
      }
      best[schedule] = std::min(best[schedule], pipe.timeline().report().bubble);
      if (schedule != Schedule::ZeroBubble) continue;
      // Every micro-batch's weight pass ran, on both stages, in every step.
      for (int s = 0; s < 2; ++s) {
        std::set<std::pair<int, int>> weighed;
        for (const auto& span : pipe.timeline().spans()) {
          if (span.track == Timeline::compute_track(s) && span.kind == SpanKind::Weight) {
            weighed.insert({span.step, span.microbatch});
          }
        }
        EXPECT_EQ(weighed.size(), 24u) << "stage " << s;
      }
    }
  }
  EXPECT_LT(best[Schedule::ZeroBubble], best[Schedule::OneFOneB])
      << fmt::format("best bubble of three tries: zb {:.3f}, 1f1b {:.3f}",
                     best[Schedule::ZeroBubble], best[Schedule::OneFOneB]);
  for (const char* worker : {"a", "b"}) EXPECT_EQ(kept_on(worker), 0) << worker;
}

TEST(Pipeline, FailuresAreNamedAndTheNextStepStartsClean) {
  LocalWorld world(three_workers());
  Chain chain(6, 16);
  at::Tensor x = torch::randn({8, 6});
  at::Tensor y = torch::randn({8, 1});
  Pipeline pipe(chain.stages, options(Schedule::OneFOneB, 4));
  {
    dist_autograd::Context context;
    std::string error = error_of([&] {
      pipe.step(x, y, [](const at::Tensor& out, const at::Tensor& target) {
        if (out.size(0) == 2 && target.sum().item<double>() > -1e9) {
          throw c10::Error("no loss for you", "");
        }
        return mse(out, target);
      });
    });
    // Whichever output reached the master first: outputs are handled on its pool threads.
    EXPECT_NE(error.find("the loss of micro-batch "), std::string::npos) << error;
    EXPECT_NE(error.find(" failed: no loss for you"), std::string::npos) << error;
  }
  for (const char* worker : {"a", "b", "c"}) EXPECT_EQ(kept_on(worker), 0) << worker;
  {
    dist_autograd::Context context;
    EXPECT_GT(pipe.step(x, y, mse).loss, 0);
  }
  // A stage that cannot take its input: the error names the micro-batch, the stage and worker.
  std::vector<remote_module::RemoteModule> wrong = {
      chain.stages[0],
      remote_module::RemoteModule::create("b", "test.mlp", mlp_config(5, 4, 1, 1))};
  Pipeline broken(wrong, options(Schedule::GPipe, 2));
  dist_autograd::Context context;
  std::string error = error_of([&] { broken.step(x, y, mse); });
  EXPECT_NE(error.find("forward of micro-batch 0 at stage 1 (\"test.mlp\") on worker \"b\""),
            std::string::npos)
      << error;
  EXPECT_EQ(kept_on("b"), 0);
}

// A worker lost before the pipeline is set up is a lost worker (PeerDied, which a training job
// answers with a spare), not a misuse of the API.
TEST(Pipeline, AWorkerLostBeforeSetUpStaysALostWorker) {
  LocalWorld world(three_workers());
  Chain chain(6, 8);
  world.peer(2).kill(SIGKILL);
  ASSERT_TRUE(world.peer(2).wait(std::chrono::seconds(10)).has_value());
  try {
    Pipeline pipe(chain.stages, options(Schedule::GPipe, 2));
    ADD_FAILURE() << "a pipeline was set up on a dead worker";
  } catch (const rpc::Error& e) {
    EXPECT_EQ(e.kind(), rpc::ErrorKind::PeerDied) << e.what();
    EXPECT_NE(std::string(e.what()).find("pipeline stage 2 (\"test.mlp\") on worker \"c\""),
              std::string::npos)
        << e.what();
  }
}

TEST(Pipeline, MisuseIsAClearError) {
  LocalWorld world(three_workers());
  Chain chain(6, 8);
  EXPECT_NE(error_of([&] {
              Pipeline(chain.stages, options(Schedule::GPipe, 0));
            }).find("at least one micro-batch"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Pipeline(chain.stages, options(Schedule::GPipe, 2, {3}));
            }).find("cannot checkpoint stage 3: the pipeline has stages 0 to 2"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              core::parse_named(schedule_names(), "zigzag", "--pipeline");
            }).find("--pipeline must be gpipe, 1f1b or zb, not \"zigzag\""),
            std::string::npos);
  Pipeline pipe(chain.stages, options(Schedule::GPipe, 2));
  at::Tensor x = torch::randn({4, 6});
  EXPECT_NE(error_of([&] {
              pipe.step(x, torch::randn({4, 1}), mse);
            }).find("needs an open ferry::dist_autograd::Context"),
            std::string::npos);
  dist_autograd::Context context;
  EXPECT_NE(error_of([&] {
              pipe.step(x, torch::randn({3, 1}), mse);
            }).find("4 inputs"),
            std::string::npos);
  // A hand-made request with a micro-batch the stage cannot order.
  const std::int64_t id = 999;
  const std::string self = rpc::self().name;
  rpc::rpc_sync(
      "a", "ferry.pipeline.setup",
      {id, std::int64_t{0}, std::int64_t{1}, rpc::to_ivalue(chain.stages[0].module_rref()), self,
       self, self, std::int64_t{4}, false, remote_module::routes_to_ivalue({}),
       c10::List<std::string>({"a"}), std::string(), true, false});
  auto forward = [&](std::int64_t microbatch) {
    rpc::rpc_sync("a", "ferry.pipeline.forward",
                  {id, std::int64_t{0}, microbatch, c10::ivalue::Tuple::create({x})});
  };
  EXPECT_NE(error_of([&] { forward(-1); }).find("micro-batch -1: micro-batches count from 0"),
            std::string::npos);
  forward(0);
  EXPECT_NE(error_of([&] { forward(0); }).find("micro-batch 0 of this step came a second time"),
            std::string::npos);
  rpc::rpc_sync("a", "ferry.pipeline.teardown", {id});
}

TEST(Pipeline, TraceHasATrackPerStageAndEveryMicroBatch) {
  LocalWorld world(three_workers());
  Chain chain(6, 64);
  Pipeline pipe(chain.stages, options(Schedule::GPipe, 4));
  for (int step = 0; step < 2; ++step) {
    dist_autograd::Context context;
    pipe.step(torch::randn({16, 6}), torch::randn({16, 1}), mse);
  }
  std::string path = ::testing::TempDir() + "ferry_pipeline_trace.json";
  pipe.timeline().write_chrome_trace(path);
  nlohmann::json trace = nlohmann::json::parse(std::ifstream(path));
  std::remove(path.c_str());
  std::map<int, std::string> tracks;
  std::map<std::pair<int, std::string>, int> counts;  // (track, category) -> spans
  for (const auto& event : trace.at("traceEvents")) {
    if (event.at("ph") == "M" && event.at("name") == "thread_name") {
      tracks[event.at("tid")] = event.at("args").at("name");
    } else if (event.at("ph") == "X") {
      EXPECT_GE(event.at("dur").get<double>(), 0);
      ++counts[{event.at("tid").get<int>(), event.at("cat").get<std::string>()}];
    }
  }
  EXPECT_EQ(tracks[pipeline::Timeline::compute_track(1)], "stage 1: test.mlp on b");
  for (int s = 0; s < 3; ++s) {
    int track = pipeline::Timeline::compute_track(s);
    EXPECT_EQ((counts[{track, "forward"}]), 8) << s;
    EXPECT_EQ((counts[{track, "backward"}]), 8) << s;
    EXPECT_EQ((counts[{pipeline::Timeline::receive_track(s), "receive"}]), 16) << s;
  }
  EXPECT_EQ((counts[{0, "loss"}]), 8);
  pipeline::TimelineReport report = pipe.timeline().report();
  EXPECT_EQ(report.steps, 2);
  EXPECT_DOUBLE_EQ(report.ideal_bubble, 2.0 / 6.0);
  for (const auto& stage : report.per_stage) {
    EXPECT_GT(stage.busy_share, 0);
    EXPECT_LE(stage.busy_share, 1);
  }
  EXPECT_NE(pipe.timeline().table().find("ideal (p - 1) / (M + p - 1) = 33%"), std::string::npos)
      << pipe.timeline().table();
}

}  // namespace
}  // namespace ferry::pipeline
