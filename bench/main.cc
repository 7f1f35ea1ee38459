// ferry-bench: benchmarks that print one JSON object last.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "apps/flag_ranges.h"
#include "bench/autograd_bench.h"
#include "bench/chaos_bench.h"
#include "bench/data_bench.h"
#include "bench/memory_bench.h"
#include "bench/pipeline_bench.h"
#include "bench/rpc_bench.h"
#include "bench/train_bench.h"
#include "ferry/core/local_world.h"
#include "ferry/core/processes.h"

namespace {

std::string self_path(const char* argv0) {
  const std::string self = ferry::core::executable_path();
  return self.empty() ? argv0 : self;
}

// Each sub-command's flags, into its settings.
CLI::App* add_rpc(CLI::App& app, ferry::bench::RpcBenchSettings& rpc) {
  auto* rpc_cmd =
      app.add_subcommand("rpc", "RPC latency, bandwidth and throughput against raw TCP");
  rpc_cmd->add_option("--rtt-iterations", rpc.rtt_iterations, "round trips timed");
  rpc_cmd->add_option("--async-calls", rpc.async_calls, "calls in the throughput run");
  rpc_cmd->add_option("--async-window", rpc.async_window, "calls in flight at once");
  rpc_cmd->add_option("--echo-mib", rpc.echo_mib, "tensor sizes of the echo measurement, MiB");
  rpc_cmd->add_option("--echo-repeats", rpc.echo_repeats, "repeats of each echo size");
  rpc_cmd->add_option("--repeats", rpc.repeats, "repeats of the throughput measurement");
  return rpc_cmd;
}

CLI::App* add_autograd(CLI::App& app, ferry::bench::AutogradBenchSettings& autograd) {
  auto* cmd = app.add_subcommand(
      "autograd", "U-Net training step split over three workers against one process");
  cmd->add_option("--depth", autograd.depth, "ResNet depth of the encoder");
  cmd->add_option("--batch", autograd.batch, "images per step");
  cmd->add_option("--image-size", autograd.image_size, "image height and width");
  cmd->add_option("--steps", autograd.steps, "timed steps of each kind");
  cmd->add_option("--warmup", autograd.warmup, "untimed steps first");
  cmd->add_option("--threads", autograd.threads, "intra-op threads per process");
  return cmd;
}

CLI::App* add_train(CLI::App& app, ferry::bench::TrainBenchSettings& train) {
  auto* train_cmd = app.add_subcommand(
      "train", "the training job with data-parallel replicas of a staged U-Net against one copy");
  train_cmd->add_option("--model", train.model, "unet-resnet18|34|50|101|152");
  train_cmd->add_option("--replicas", train.replicas, "replicas compared with one (2 or more)");
  train_cmd->add_option("--batch", train.batch, "images per replica and step");
  train_cmd->add_option("--image-size", train.image_size, "image height and width");
  train_cmd->add_option("--steps", train.steps, "timed steps of each job");
  train_cmd->add_option("--repeats", train.repeats, "jobs of each configuration");
  train_cmd->add_option("--stages", train.stages, "1 or 2 stages per replica");
  train_cmd->add_option("--partition", train.partition, "the first block of the second stage");
  train_cmd->add_flag("--same-global-batch", train.same_global_batch,
                      "the one copy trains on every replica's images per step (as one process "
                      "against DDP), not on one replica's");
  train_cmd->add_option("--bucket-mib", train.bucket_mib, "the replicas' gradient bucket size");
  train_cmd->add_flag("!--no-bf16", train.bf16, "leave out the bf16-mixed job");
  train_cmd->add_option("--log-file", train.log_file, "where the jobs' own output goes");
  return train_cmd;
}

CLI::App* add_pipeline(CLI::App& app, ferry::bench::PipelineBenchSettings& pipeline) {
  auto* pipeline_cmd = app.add_subcommand(
      "pipeline", "naive model parallelism against GPipe and 1F1B over 1-8 micro-batches");
  pipeline_cmd->add_option("--model", pipeline.model, "synthetic (balanced stages) or unet");
  pipeline_cmd->add_option("--stages", pipeline.stages,
                           "stages, one worker each (synthetic: default 2; unet: default its 3 "
                           "seams, else balanced)");
  ferry::apps::add_choice(pipeline_cmd, "--balance", pipeline.balance,
                          ferry::trainer::balance_names(), "unet with --stages: what to balance");
  pipeline_cmd->add_option("--width", pipeline.width, "synthetic: features of every layer");
  pipeline_cmd->add_option("--layers", pipeline.layers, "synthetic: layers per stage");
  pipeline_cmd->add_option("--batch", pipeline.batch, "samples or images per step");
  pipeline_cmd->add_option("--depth", pipeline.depth, "unet: ResNet depth of the encoder");
  pipeline_cmd->add_option("--image-size", pipeline.image_size, "unet: image height and width");
  pipeline_cmd->add_option("--microbatches", pipeline.microbatches, "micro-batch counts to run");
  pipeline_cmd->add_option("--steps", pipeline.steps, "timed steps of each configuration");
  pipeline_cmd->add_option("--warmup", pipeline.warmup, "untimed steps of each first");
  pipeline_cmd->add_flag("!--no-pin", pipeline.pin, "do not pin each worker to a core");
  pipeline_cmd->add_flag("!--no-rebalance", pipeline.rebalance,
                         "unet: keep the cut measured before the workers start");
  ferry::apps::add_choice(pipeline_cmd, "--loss-on", pipeline.loss_on,
                          ferry::trainer::loss_placement_names(),
                          "where the loss is computed (auto: the last stage)");
  pipeline_cmd->add_option("--trace", pipeline.trace_file,
                           "write a Chrome trace of the last configuration's steps");
  return pipeline_cmd;
}

CLI::App* add_memory(CLI::App& app, ferry::bench::MemoryBenchSettings& memory) {
  auto* memory_cmd = app.add_subcommand(
      "memory", "each stage's peak memory, and the largest batch within one process's budget");
  memory_cmd->add_option("--depth", memory.depth, "ResNet depth of the U-Net's encoder");
  memory_cmd->add_option("--image-size", memory.image_size, "image height and width");
  memory_cmd->add_option("--batch", memory.batch,
                         "base batch: the one process's peak at it is the budget");
  memory_cmd->add_option("--stages", memory.stages, "stages balanced by memory, a worker each");
  memory_cmd->add_option("--microbatches", memory.microbatches, "micro-batches under 1F1B");
  memory_cmd->add_option("--max-batch", memory.max_batch, "the largest batch tried");
  memory_cmd->add_option("--resolution", memory.resolution, "the bisection's last step");
  ferry::apps::add_choice(memory_cmd, "--optimizer", memory.optimizer,
                          ferry::trainer::optimizer_names(), "the optimizer");
  return memory_cmd;
}

CLI::App* add_chaos(CLI::App& app, ferry::bench::ChaosBenchSettings& chaos) {
  auto* cmd = app.add_subcommand(
      "chaos", "a soak: a worker of a 2 x 2 job with spares killed every few steps, many times");
  cmd->add_option("--model", chaos.model, "unet-resnet18|34|50|101|152");
  cmd->add_option("--image-size", chaos.image_size, "image height and width");
  cmd->add_option("--samples", chaos.samples, "images, a share of them for validation");
  cmd->add_option("--batch", chaos.batch, "images per replica and step");
  cmd->add_option("--epochs", chaos.epochs, "epochs of the job (a checkpoint after each)");
  cmd->add_option("--kills", chaos.kills, "workers killed, one at a time");
  cmd->add_option("--every", chaos.every, "steps trained after a recovery before the next kill");
  cmd->add_option("--spares", chaos.spares, "spare workers of each world");
  cmd->add_option("--checkpoint-every-steps", chaos.checkpoint_every,
                  "the job's --checkpoint-every-steps: where a restart goes back to")
      ->check(ferry::apps::count_up_to(1'000'000));
  cmd->add_option("--seed", chaos.seed, "which workers are killed");
  cmd->add_option("--stall-limit-s", chaos.stall_limit_s,
                  "seconds without training after a kill that count as a hang");
  cmd->add_option("--work-dir", chaos.work_dir,
                  "keep checkpoints and logs here (default: a temporary folder, removed)");
  cmd->add_flag("--unbroken,!--no-unbroken", chaos.unbroken,
                "then train the job without kills and compare its final weights (default: on)");
  return cmd;
}

CLI::App* add_data(CLI::App& app, ferry::bench::DataBenchSettings& data) {
  auto* cmd = app.add_subcommand(
      "data", "the batch loader's images per second with 1 to N threads beside a training step's");
  cmd->add_option("--data", data.data,
                  "a folder DIR/images, DIR/masks; where DIR has no images/, the written folder "
                  "goes there and stays (default: a temporary one)");
  cmd->add_option("--images", data.images, "images of the written folder");
  cmd->add_option("--source-size", data.source_size, "height and width of the written images");
  cmd->add_option("--crop", data.crop, "the square each image is cut to, as train --crop");
  cmd->add_option("--classes", data.classes, "classes of the masks (2 to 4 written)");
  cmd->add_option("--max-threads", data.max_threads, "loader threads: 1, 2, 4, ... up to this");
  cmd->add_option("--batch", data.batch, "images per batch and per training step");
  cmd->add_option("--batches", data.batches, "batches timed per measurement");
  cmd->add_option("--repeats", data.repeats, "measurements per thread count");
  cmd->add_option("--model", data.model, "the U-Net whose step is set beside");
  cmd->add_option("--steps", data.steps, "timed training steps");
  return cmd;
}

}  // namespace

int main(int argc, char** argv) {
  // Every process of a benchmark shares this machine's cores, this one included (it drives the
  // split and trains the one-process baseline). libgomp reads the setting when it loads, so the
  // benchmark starts itself again with it; its workers inherit it. See
  // core::kSharedMachineSpinCount.
  if (!std::getenv("GOMP_SPINCOUNT")) {
    setenv("GOMP_SPINCOUNT", ferry::core::kSharedMachineSpinCount, 1);
    std::string self = self_path(argv[0]);
    execv(self.c_str(), argv);
  }
  CLI::App app("Ferry benchmarks: each prints one JSON object as its last line");
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();
  const std::string self = self_path(argv[0]);
  ferry::bench::RpcBenchSettings rpc;
  ferry::bench::AutogradBenchSettings autograd;
  ferry::bench::TrainBenchSettings train;
  ferry::bench::PipelineBenchSettings pipeline;
  ferry::bench::MemoryBenchSettings memory;
  ferry::bench::ChaosBenchSettings chaos;
  ferry::bench::DataBenchSettings data;
  rpc.self_path = autograd.self_path = train.self_path = pipeline.self_path = memory.self_path =
      chaos.self_path = self;
  CLI::App* rpc_cmd = add_rpc(app, rpc);
  CLI::App* autograd_cmd = add_autograd(app, autograd);
  CLI::App* train_cmd = add_train(app, train);
  CLI::App* pipeline_cmd = add_pipeline(app, pipeline);
  CLI::App* memory_cmd = add_memory(app, memory);
  CLI::App* chaos_cmd = add_chaos(app, chaos);
  CLI::App* data_cmd = add_data(app, data);
  auto* peer_cmd = app.add_subcommand("rpc-peer", "the peer process of `rpc` (started by it)");
  peer_cmd->group("");
  CLI11_PARSE(app, argc, argv);
  // A benchmark that cannot go on says why in one line and exits 1, instead of terminating.
  try {
    if (*rpc_cmd) return ferry::bench::run_rpc_bench(rpc);
    if (*autograd_cmd) return ferry::bench::run_autograd_bench(autograd);
    if (*train_cmd) return ferry::bench::run_train_bench(train);
    if (*pipeline_cmd) return ferry::bench::run_pipeline_bench(pipeline);
    if (*memory_cmd) return ferry::bench::run_memory_bench(memory);
    if (*chaos_cmd) return ferry::bench::run_chaos_bench(chaos);
    if (*data_cmd) return ferry::bench::run_data_bench(data);
    if (*peer_cmd) return ferry::bench::run_rpc_peer();
  } catch (const std::exception& e) {
    std::cerr << "ferry-bench " << app.get_subcommands().front()->get_name() << ": " << e.what()
              << "\n";
  }
  return 1;
}
