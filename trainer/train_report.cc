#include "trainer/train_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "ferry/dist_autograd/context.h"
#include "ferry/remote_module/checkpoint.h"
#include "trainer/rebalance.h"

namespace ferry::trainer {
namespace {

using models::RemoteUnet;

std::string clock_text(double seconds) {
  int s = static_cast<int>(seconds + 0.5);
  return fmt::format("{}:{:02d}", s / 60, s % 60);
}

}  // namespace

ProgressBar::ProgressBar(std::string title, std::size_t steps)
    : title_(std::move(title)), steps_(steps), tty_(isatty(STDERR_FILENO)), start_(Clock::now()) {}

void ProgressBar::update(std::size_t step, const std::string& figures) {
  double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  double eta = step == 0 ? 0 : elapsed / step * (steps_ - step);
  constexpr int kWidth = 24;
  int filled = static_cast<int>(kWidth * step / std::max<std::size_t>(steps_, 1));
  std::string line =
      fmt::format("{} [{}{}] {}/{} {} ETA {}", title_, std::string(filled, '#'),
                  std::string(kWidth - filled, '.'), step, steps_, figures, clock_text(eta));
  bool last = step == steps_;
  if (tty_) {
    std::cerr << "\r" << line << (last ? "\n" : "") << std::flush;
  } else if (last || step % std::max<std::size_t>(steps_ / 10, 1) == 0) {
    std::cerr << line << "\n" << std::flush;
  }
}

void print_stage_table(const RemoteUnet& split, double train_s, bool direct) {
  std::vector<remote_module::StageStats> stats;
  double computed = 0;
  for (const RemoteUnet::Stage& stage : split.stages()) {
    stats.push_back(stage.module.stats());
    computed += stats.back().forward_s;
  }
  std::map<std::string, double> backward_by_worker;
  std::cerr << fmt::format("\n{:<8} {:<10} {:<7} {:>11} {:>10} {:>10} {:>10} {:>6} {:>11} {:>9}\n",
                           "stage", "worker", "device", "parameters", "forward s", "backward s",
                           "network s", "idle", "tensors MiB", "RSS MiB");
  for (size_t k = 0; k < stats.size(); ++k) {
    const RemoteUnet::Stage& stage = split.stages()[k];
    const std::string& worker = stage.module.worker();
    if (!backward_by_worker.count(worker)) {
      backward_by_worker[worker] = dist_autograd::backward_seconds(worker);
    }
    double backward = backward_by_worker[worker];
    // Stage to stage, the master sees only the whole chain: its transfers go on the first row.
    std::string network =
        !direct  ? fmt::format("{:.2f}", std::max(0.0, stage.forward_s - stats[k].forward_s))
        : k == 0 ? fmt::format("{:.2f}", std::max(0.0, stage.forward_s - computed))
                 : "-";
    double idle = train_s > 0 ? std::max(0.0, 1 - (stats[k].forward_s + backward) / train_s) : 0;
    std::cerr << fmt::format(
        "{:<8} {:<10} {:<7} {:>11} {:>10.2f} {:>10.2f} {:>10} {:>5.0f}% {:>11.0f} {:>9.0f}\n",
        stage.name(), worker, stats[k].device, stats[k].parameters, stats[k].forward_s, backward,
        network, 100 * idle, stats[k].worker_peak_tensor_mib, stats[k].worker_peak_rss_mib);
  }
  std::cerr << "backward s is per worker (all stages it hosts); network s is forward time seen "
               "by the master minus the stages' own ("
            << (direct ? "activations go stage to stage, so the first row has the whole chain's"
                       : "activations go through the master, so each row has its stage's")
            << "); idle is the share of training time the worker computed nothing; tensors and "
               "RSS are the worker's peaks (tensor memory as its allocator counts it).\n";
}

StageSeconds per_batch(const StageSeconds& from, const StageSeconds& to, std::size_t batches) {
  const double n = static_cast<double>(std::max<std::size_t>(batches, 1));
  auto each = [n](const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> out;
    if (a.size() != b.size()) return out;
    for (std::size_t k = 0; k < b.size(); ++k) out.push_back((b[k] - a[k]) / n);
    return out;
  };
  StageSeconds out;
  out.compute = each(from.compute, to.compute);
  out.busy = each(from.busy, to.busy);
  out.blocks = each(from.blocks, to.blocks);
  out.per_worker = to.per_worker;
  return out;
}

StageSeconds stage_seconds(const Replica& replica) {
  StageSeconds out;
  out.blocks = measured_block_s(replica.split.modules());
  if (replica.pipe) {
    for (const pipeline::StageReport& stage : replica.pipe->timeline().report().per_stage) {
      out.compute.push_back(stage.compute_s());
      out.busy.push_back(stage.compute_s() + stage.send_s);
    }
    return out;
  }
  std::map<std::string, double> by_worker;
  for (const RemoteUnet::Stage& stage : replica.split.stages()) {
    by_worker[stage.module.worker()] += stage.module.stats().forward_s;
  }
  for (auto& [worker, seconds] : by_worker) seconds += dist_autograd::backward_seconds(worker);
  for (const RemoteUnet::Stage& stage : replica.split.stages()) {
    out.compute.push_back(by_worker.at(stage.module.worker()));
  }
  out.busy = out.compute;
  out.per_worker = true;
  return out;
}

std::optional<BestRecord> report_best(const EpochMonitor& monitor, const std::string& best_dir,
                                      int stopped_after) {
  if (monitor.best_epoch() == 0) return std::nullopt;
  std::string line = fmt::format("best epoch: {} ({} {:.4f})", monitor.best_epoch(),
                                 monitor.metric_name(), monitor.best_value());
  BestRecord out;
  out.monitor = monitor.metric_name();
  out.best_epoch = monitor.best_epoch();
  out.best_value = monitor.best_value();
  if (!best_dir.empty() && remote_module::has_checkpoint(best_dir)) {
    out.best_checkpoint = remote_module::latest_checkpoint_folder(best_dir);
    line += fmt::format("; its checkpoint: {} (--checkpoint-dir {} --resume starts from it)",
                        out.best_checkpoint, best_dir);
  }
  if (stopped_after > 0) {
    line += fmt::format("; stopped early after epoch {}: {} did not improve for {} epochs",
                        stopped_after, monitor.metric_name(), monitor.patience());
    out.stopped_after_epoch = stopped_after;
  }
  std::cerr << line << "\n";
  return out;
}

std::string per_class(const std::vector<std::string>& names, const std::vector<double>& values) {
  std::vector<std::string> parts;
  for (std::size_t k = 0; k < names.size() && k < values.size(); ++k) {
    parts.push_back(fmt::format("{} {:.3f}", names[k], values[k]));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::vector<ClassFigures> class_figures(const std::vector<std::string>& names,
                                        const Validation& v) {
  std::vector<ClassFigures> out;
  for (std::size_t k = 0; k < names.size() && k < v.class_iou.size(); ++k) {
    out.push_back({names[k], v.class_iou[k], v.class_dice[k]});
  }
  return out;
}

std::string class_table(const std::vector<std::string>& names, const Validation& v) {
  std::size_t width = 16;
  for (const std::string& name : names) width = std::max(width, name.size() + 2);
  // A class found in neither the masks nor the predictions has no figure.
  auto figure = [](double x) {
    return std::isnan(x) ? std::string("-") : fmt::format("{:.4f}", x);
  };
  std::string out = fmt::format("{:<{}}{:>8}{:>8}\n", "class", width, "IoU", "Dice");
  for (std::size_t k = 0; k < names.size() && k < v.class_iou.size(); ++k) {
    out += fmt::format("{:<{}}{:>8}{:>8}\n", names[k], width, figure(v.class_iou[k]),
                       figure(v.class_dice[k]));
  }
  out += fmt::format("{:<{}}{:>8}{:>8}\n", "foreground mean", width, figure(v.iou), figure(v.dice));
  out += fmt::format("{:<{}}{:>8}\n", "mIoU (all)", width, figure(v.miou));
  return out;
}

std::vector<BucketRecord> bucket_records(const dist_autograd::DistributedOptimizer& optimizer) {
  std::vector<BucketRecord> out;
  for (const auto& owner : optimizer.bucket_stats()) {
    out.push_back({owner.worker, owner.replica, owner.buckets,
                   static_cast<double>(owner.bytes) / (1 << 20), owner.started_in_backward,
                   owner.started_at_step, owner.late_rounds, owner.waited_s});
  }
  return out;
}

PipelineRecord report_pipeline(pipeline::Pipeline& pipe, const StagePlan& plan,
                               const std::string& trace_file) {
  std::cerr << "\n" << pipe.timeline().table();
  std::vector<pipeline::Pipeline::StageMemory> memory = pipe.memory_peaks();
  std::string peaks;
  for (std::size_t k = 0; k < memory.size(); ++k) {
    peaks += fmt::format("{}{} {:.0f} MiB", k ? ", " : "", plan.stages[k].name,
                         memory[k].activation_mib);
  }
  std::cerr << "most activations held at once: " << peaks << "\n";
  pipeline::TimelineReport report = pipe.timeline().report();
  const PipelineRecord out{pipeline::schedule_name(pipe.options().schedule),
                           pipe.options().microbatches, report.bubble, report.ideal_bubble};
  if (trace_file.empty()) return out;
  pipe.timeline().write_chrome_trace(trace_file);
  std::cerr << fmt::format(
      "trace of {} steps written to {} (open it in Perfetto or chrome://tracing)\n", report.steps,
      trace_file);
  return out;
}

}  // namespace ferry::trainer
