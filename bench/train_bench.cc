// Each run is a whole job, as a user starts it; only its steps are timed (the job's own metrics:
// the seconds of each epoch's steps and of its optimizer calls), so start-up and validation do
// not count. Runs of the two configurations alternate so that both see the same noise of this
// shared machine. Every process of a run gets one intra-op thread.
#include "bench/train_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "bench/processes.h"
#include "bench/stats.h"

namespace ferry::bench {
namespace {

struct Timings {
  std::vector<double> step_s, optimizer_s, images_per_s, bytes_per_step;
};

// One job of `replicas` copies in `precision`; adds its timed epoch's figures to `into`.
void run_job(const TrainBenchSettings& s, int replicas, const std::string& precision,
             Timings& into) {
  const int stages = 2;
  const std::string metrics =
      fmt::format("/tmp/ferry-bench-train-{}-{}-{}.json", getpid(), replicas, precision);
  // Two epochs of `steps` batches each, and a validation share that keeps them whole.
  const int train_images = s.steps * s.batch * replicas;
  // clang-format off
  const std::vector<std::string> args = {
      "--nproc", std::to_string(1 + stages * replicas), "--",
      binary_dir(s.self_path) + "/ferry-master", "train",
      "--model", s.model, "--image-size", std::to_string(s.image_size),
      "--samples", std::to_string(train_images + train_images / 4), "--epochs", "2",
      "--batch-size", std::to_string(s.batch), "--replicas", std::to_string(replicas),
      "--partition", s.partition, "--optimizer", "sgd", "--precision", precision,
      "--metrics-file", metrics};
  // clang-format on
  const int status = run_process(binary_dir(s.self_path) + "/ferry-launch", args,
                                 {{"OMP_NUM_THREADS", "1"}}, s.log_file);
  if (status != 0) {
    throw std::runtime_error(
        fmt::format("the job of {} replicas failed (exit status {}); its output is in {}", replicas,
                    status, s.log_file));
  }
  auto epochs = nlohmann::json::parse(std::ifstream(metrics))["epochs"];
  std::remove(metrics.c_str());
  const auto& timed = epochs.back();
  const double batches = timed["batches"].get<double>();
  into.step_s.push_back(timed["train_s"].get<double>() / batches);
  into.optimizer_s.push_back(timed["optimizer_s"].get<double>() / batches);
  into.images_per_s.push_back(timed["images_per_s"].get<double>());
  into.bytes_per_step.push_back(timed["bytes_per_step"].get<double>());
}

}  // namespace

int run_train_bench(const TrainBenchSettings& settings) {
  if (settings.replicas < 2) {
    std::cerr << "ferry-bench train: --replicas must be 2 or more (it is compared with 1)\n";
    return 2;
  }
  std::remove(settings.log_file.c_str());
  Timings one, many, bf16;
  try {
    for (int repeat = 0; repeat < settings.repeats; ++repeat) {
      run_job(settings, 1, "32", one);
      run_job(settings, settings.replicas, "32", many);
      run_job(settings, 1, "bf16-mixed", bf16);
      std::cerr << fmt::format(
          "repeat {}: 1 replica {:.3f} s/step ({:.1f} img/s), {} replicas {:.3f} s/step "
          "({:.1f} img/s), 1 replica in bf16-mixed {:.3f} s/step\n",
          repeat, one.step_s.back(), one.images_per_s.back(), settings.replicas, many.step_s.back(),
          many.images_per_s.back(), bf16.step_s.back());
    }
  } catch (const std::exception& e) {
    std::cerr << "ferry-bench train: " << e.what() << "\n";
    return 1;
  }
  nlohmann::ordered_json out;
  out["benchmark"] = "train";
  out["model"] = settings.model;
  out["image_size"] = settings.image_size;
  out["batch_per_replica"] = settings.batch;
  out["stages"] = 2;
  out["replicas"] = settings.replicas;
  out["steps"] = settings.steps;
  out["repeats"] = settings.repeats;
  out["step_s_1"] = median(one.step_s);
  out["step_s_replicated"] = median(many.step_s);
  out["images_per_s_1"] = median(one.images_per_s);
  out["images_per_s_replicated"] = median(many.images_per_s);
  out["throughput_ratio"] = median(many.images_per_s) / median(one.images_per_s);
  out["optimizer_s_1"] = median(one.optimizer_s);
  out["optimizer_s_replicated"] = median(many.optimizer_s);
  // What the replicas add to the optimizer's calls is their gradients' all-reduce.
  out["allreduce_share"] =
      std::max(0.0, median(many.optimizer_s) - median(one.optimizer_s)) / median(many.step_s);
  out["bf16_step_s"] = median(bf16.step_s);
  out["bf16_step_ratio"] = median(bf16.step_s) / median(one.step_s);
  out["bytes_per_step_32"] = median(one.bytes_per_step);
  out["bytes_per_step_bf16"] = median(bf16.bytes_per_step);
  out["bf16_bytes_ratio"] = median(bf16.bytes_per_step) / median(one.bytes_per_step);
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace ferry::bench
