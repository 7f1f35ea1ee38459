#include "bench/memory_bench.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "bench/processes.h"
#include "bench/stats.h"
#include "ferry/core/process_memory.h"
#include "ferry/core/processes.h"
#include "ferry/trainer/worker_loop.h"
#include "trainer/run_report.h"

namespace ferry::bench {
namespace {

// Runs a Ferry binary outside any world this process may be a rank of, and keeps what it prints.
core::CommandOutput run(const std::vector<std::string>& command) {
  return core::run_process(command, {{}, {"RANK", "WORLD_SIZE", "SLURM_PROCID"}});
}

void add(std::vector<std::string>& command, std::initializer_list<std::string> words) {
  command.insert(command.end(), words.begin(), words.end());
}

class Bench {
 public:
  explicit Bench(const MemoryBenchSettings& s)
      : s_(s),
        master_(core::executable_dir() + "/ferry-master"),
        launch_(core::executable_dir() + "/ferry-launch"),
        model_(fmt::format("unet-resnet{}", s.depth)),
        metrics_(fmt::format("/tmp/ferry-memory-bench-{}.json", getpid())) {}
  ~Bench() { std::filesystem::remove(metrics_); }

  // The single process's peaks at `batch`, or nullopt if it does not fit `budget_mib` (0: none).
  std::optional<nlohmann::json> single(int batch, int64_t budget_mib) {
    std::vector<std::string> command = {
        master_,        "footprint",
        "--model",      model_,
        "--image-size", std::to_string(s_.image_size),
        "--batch-size", std::to_string(batch),
        "--optimizer",  core::name_of(trainer::optimizer_names(), s_.optimizer)};
    if (budget_mib > 0) add(command, {"--memory-budget-mib", std::to_string(budget_mib)});
    core::CommandOutput r = run(command);
    log(fmt::format("one process, batch {}: {}", batch,
                    r.status == 0 ? r.last_line() : "does not fit"));
    if (r.status != 0) {
      check_failure(r);
      return std::nullopt;
    }
    return nlohmann::json::parse(r.last_line());
  }

  // The stages' figures after one training step at `batch` under `setting`, or nullopt if a
  // process ran out of its budget.
  std::optional<std::vector<trainer::StageRecord>> split(int batch, const std::string& setting,
                                                         int64_t budget_mib) {
    // One training batch, and a fifth of it again for validation.
    const int samples = batch + std::max(1, batch / 4);
    std::vector<std::string> command = {launch_,
                                        "--nproc",
                                        std::to_string(s_.stages + 1),
                                        "--",
                                        master_,
                                        "train",
                                        "--model",
                                        model_,
                                        "--image-size",
                                        std::to_string(s_.image_size),
                                        "--batch-size",
                                        std::to_string(batch),
                                        "--samples",
                                        std::to_string(samples),
                                        "--epochs",
                                        "1",
                                        "--optimizer",
                                        core::name_of(trainer::optimizer_names(), s_.optimizer),
                                        "--stages",
                                        std::to_string(s_.stages),
                                        "--balance",
                                        "memory",
                                        "--metrics-file",
                                        metrics_};
    if (setting != "naive") {
      add(command, {"--pipeline", "1f1b", "--microbatches", std::to_string(s_.microbatches)});
    }
    if (setting == "1f1b_checkpointed") add(command, {"--checkpoint-activations"});
    if (budget_mib > 0) add(command, {"--memory-budget-mib", std::to_string(budget_mib)});
    core::CommandOutput r = run(command);
    if (r.status != 0) {
      log(fmt::format("{} stages, {}, batch {}: does not fit", s_.stages, setting, batch));
      check_failure(r);
      return std::nullopt;
    }
    std::vector<trainer::StageRecord> stages = trainer::read_run_report(metrics_).stages;
    std::string peaks;
    for (const trainer::StageRecord& stage : stages) {
      peaks += fmt::format(" {}", std::lround(stage.worker_peak_tensor_mib));
    }
    log(fmt::format("{} stages, {}, batch {}: stage peaks (MiB){}", s_.stages, setting, batch,
                    peaks));
    return stages;
  }

  // The largest batch for which `fits` holds, from `known` (which fits): doubling, then
  // bisection down to the resolution, both capped at the settings' max_batch.
  int largest_batch(int known, const std::function<bool(int)>& fits) {
    int good = known, bad = 0;
    while (bad == 0) {
      int next = std::min(good * 2, s_.max_batch);
      if (next == good) return good;
      if (fits(next)) {
        good = next;
      } else {
        bad = next;
      }
    }
    while (bad - good > s_.resolution) {
      int mid = (good + bad) / 2 / s_.resolution * s_.resolution;
      if (mid <= good) break;
      if (fits(mid)) {
        good = mid;
      } else {
        bad = mid;
      }
    }
    return good;
  }

 private:
  // A run that failed for another reason than memory makes the benchmark meaningless.
  void check_failure(const core::CommandOutput& r) {
    if (r.status != trainer::kExitOutOfMemory) {
      throw std::runtime_error("a run failed for another reason than memory:\n" + r.output);
    }
  }
  void log(const std::string& line) { std::cerr << "memory: " << line << std::endl; }

  MemoryBenchSettings s_;
  std::string master_, launch_, model_, metrics_;
};

double largest_peak(const std::vector<trainer::StageRecord>& stages) {
  double out = 0;
  for (const trainer::StageRecord& stage : stages) {
    out = std::max(out, stage.worker_peak_tensor_mib);
  }
  return out;
}

double total_peak(const std::vector<trainer::StageRecord>& stages) {
  double out = 0;
  for (const trainer::StageRecord& stage : stages) out += stage.worker_peak_tensor_mib;
  return out;
}

}  // namespace

int run_memory_bench(const MemoryBenchSettings& s) {
  Bench bench(s);
  auto start = Clock::now();
  std::optional<nlohmann::json> single = bench.single(s.batch, 0);
  if (!single) throw std::runtime_error("the single process failed without a budget");
  const double single_peak = single->at("peak_tensor_mib").get<double>();
  const auto budget = static_cast<int64_t>(std::ceil(single_peak));

  nlohmann::ordered_json out;
  out["benchmark"] = "memory";
  out["model"] = fmt::format("unet-resnet{}", s.depth);
  out["image_size"] = s.image_size;
  out["batch"] = s.batch;
  out["optimizer"] = core::name_of(trainer::optimizer_names(), s.optimizer);
  out["stages"] = s.stages;
  out["microbatches"] = s.microbatches;
  out["single_peak_mib"] = single_peak;
  out["single_peak_rss_mib"] = single->at("peak_rss_mib").get<double>();
  out["split"] = nlohmann::ordered_json::object();
  std::string best;
  double best_peak = 0, best_total = 0;
  for (const std::string setting : {"naive", "1f1b", "1f1b_checkpointed"}) {
    std::optional<std::vector<trainer::StageRecord>> stages = bench.split(s.batch, setting, 0);
    if (!stages) throw std::runtime_error("the split failed without a budget: " + setting);
    out["split"][setting] = nlohmann::ordered_json(*stages);
    // Within a MiB of the least largest peak, the setting that holds less in all wins: it leaves
    // more room as the batch grows.
    const double peak = largest_peak(*stages), total = total_peak(*stages);
    if (best.empty() || peak < best_peak - 1 || (peak < best_peak + 1 && total < best_total)) {
      best = setting;
      best_peak = peak;
      best_total = total;
    }
  }
  out["best_setting"] = best;
  out["largest_stage_peak_mib"] = best_peak;
  out["largest_stage_over_single"] = best_peak / single_peak;
  out["budget_mib"] = budget;
  const int max_single =
      bench.largest_batch(s.batch, [&](int b) { return bench.single(b, budget).has_value(); });
  const int max_split =
      bench.split(s.batch, best, budget)
          ? bench.largest_batch(s.batch,
                                [&](int b) { return bench.split(b, best, budget).has_value(); })
          : 0;
  out["max_batch_single"] = max_single;
  out["max_batch_split"] = max_split;
  out["max_batch_ratio"] = static_cast<double>(max_split) / max_single;
  out["max_batch_cap"] = s.max_batch;
  out["seconds"] = std::chrono::duration<double>(Clock::now() - start).count();
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace ferry::bench
