// Each run is a whole job, as a user starts it; only its steps are timed (the job's own metrics:
// the seconds of each epoch's steps and of its optimizer calls), so start-up and validation do
// not count. Runs of the two configurations alternate so that both see the same noise of this
// shared machine. Every process of a run gets one intra-op thread.
#include "bench/train_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "bench/processes.h"
#include "bench/stats.h"
#include "ferry/core/processes.h"
#include "trainer/run_report.h"

namespace ferry::bench {
namespace {

struct Timings {
  std::vector<double> step_s, optimizer_s, images_per_s, bytes_per_step;
  std::vector<std::vector<double>> stage_peak_mib;  // per run, replica 0's stages
  std::vector<trainer::BucketRecord> buckets;       // the last run's
};

// One job of `replicas` copies in `precision`; adds its timed epoch's figures to `into`.
void run_job(const TrainBenchSettings& s, int replicas, const std::string& precision,
             Timings& into) {
  const std::string metrics =
      fmt::format("/tmp/ferry-bench-train-{}-{}-{}.json", getpid(), replicas, precision);
  const int batch = replicas == 1 && s.same_global_batch ? s.batch * s.replicas : s.batch;
  // Two epochs of `steps` batches each, and a validation share that keeps them whole.
  const int train_images = s.steps * batch * replicas;
  // clang-format off
  std::vector<std::string> args = {
      "--nproc", std::to_string(1 + s.stages * replicas), "--",
      core::executable_dir() + "/ferry-master", "train",
      "--model", s.model, "--image-size", std::to_string(s.image_size),
      "--samples", std::to_string(train_images + train_images / 4), "--epochs", "2",
      "--batch-size", std::to_string(batch), "--replicas", std::to_string(replicas),
      "--optimizer", "sgd", "--precision", precision, "--metrics-file", metrics};
  // clang-format on
  if (s.bucket_mib != TrainBenchSettings{}.bucket_mib) {
    args.insert(args.end(), {"--bucket-mib", fmt::format("{}", s.bucket_mib)});
  }
  if (s.stages == 1) {
    args.insert(args.end(), {"--stages", "1"});
  } else {
    args.insert(args.end(), {"--partition", s.partition});
  }
  const int status = run_process(core::executable_dir() + "/ferry-launch", args,
                                 {{"OMP_NUM_THREADS", "1"}}, s.log_file);
  if (status != 0) {
    throw std::runtime_error(
        fmt::format("the job of {} replicas failed (exit status {}); its output is in {}", replicas,
                    status, s.log_file));
  }
  const trainer::RunReport job = trainer::read_run_report(metrics);
  std::remove(metrics.c_str());
  if (job.epochs.empty()) throw std::runtime_error(metrics + ": the job reported no epoch");
  const trainer::EpochRecord& timed = job.epochs.back();
  std::vector<double> peaks;
  for (const trainer::StageRecord& stage : job.stages)
    peaks.push_back(stage.worker_peak_tensor_mib);
  into.stage_peak_mib.push_back(peaks);
  if (!job.gradient_buckets.empty()) into.buckets = job.gradient_buckets;
  const auto batches = static_cast<double>(timed.batches);
  into.step_s.push_back(timed.train_s / batches);
  into.optimizer_s.push_back(timed.optimizer_s / batches);
  into.images_per_s.push_back(timed.images_per_s);
  into.bytes_per_step.push_back(timed.bytes_per_step);
}

}  // namespace

// Each stage's median over the runs.
std::vector<double> median_per_stage(const std::vector<std::vector<double>>& runs) {
  std::vector<double> out;
  for (std::size_t k = 0; !runs.empty() && k < runs.front().size(); ++k) {
    std::vector<double> values;
    for (const auto& run : runs) values.push_back(run.at(k));
    out.push_back(median(values));
  }
  return out;
}

int run_train_bench(const TrainBenchSettings& settings) {
  if (settings.replicas < 2) {
    std::cerr << "ferry-bench train: --replicas must be 2 or more (it is compared with 1)\n";
    return 2;
  }
  if (settings.stages != 1 && settings.stages != 2) {
    std::cerr << "ferry-bench train: --stages must be 1 or 2\n";
    return 2;
  }
  std::remove(settings.log_file.c_str());
  Timings one, many, bf16;
  try {
    for (int repeat = 0; repeat < settings.repeats; ++repeat) {
      run_job(settings, 1, "32", one);
      run_job(settings, settings.replicas, "32", many);
      std::cerr << fmt::format(
          "repeat {}: 1 replica {:.3f} s/step ({:.1f} img/s), {} replicas {:.3f} s/step "
          "({:.1f} img/s)\n",
          repeat, one.step_s.back(), one.images_per_s.back(), settings.replicas, many.step_s.back(),
          many.images_per_s.back());
      if (!settings.bf16) continue;
      run_job(settings, 1, "bf16-mixed", bf16);
      std::cerr << fmt::format("repeat {}: 1 replica in bf16-mixed {:.3f} s/step\n", repeat,
                               bf16.step_s.back());
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
  out["batch_of_one_copy"] =
      settings.same_global_batch ? settings.batch * settings.replicas : settings.batch;
  out["stages"] = settings.stages;
  out["bucket_mib"] = settings.bucket_mib;
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
  // What the replicas add to the optimizer's calls is the part of their gradients' all-reduce
  // that the backward did not hide.
  const double exposed = std::max(0.0, median(many.optimizer_s) - median(one.optimizer_s));
  out["allreduce_exposed_s"] = exposed;
  out["allreduce_share"] = exposed / median(many.step_s);
  out["stage_peak_tensor_mib_1"] = median_per_stage(one.stage_peak_mib);
  out["stage_peak_tensor_mib_replicated"] = median_per_stage(many.stage_peak_mib);
  out["gradient_buckets"] = nlohmann::ordered_json(many.buckets);
  if (settings.bf16) {
    out["bf16_step_s"] = median(bf16.step_s);
    out["bf16_step_ratio"] = median(bf16.step_s) / median(one.step_s);
    out["bytes_per_step_32"] = median(one.bytes_per_step);
    out["bytes_per_step_bf16"] = median(bf16.bytes_per_step);
    out["bf16_bytes_ratio"] = median(bf16.bytes_per_step) / median(one.bytes_per_step);
  }
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace ferry::bench
