#include "bench/pipeline_bench.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/pipeline_model.h"
#include "bench/processes.h"
#include "bench/stats.h"
#include "ferry/core/local_world.h"
#include "ferry/core/process_memory.h"
#include "ferry/core/processes.h"
#include "ferry/dist_autograd/context.h"
#include "ferry/models/remote_unet.h"
#include "ferry/pipeline/pipeline.h"
#include "ferry/remote_module/loss.h"
#include "ferry/rpc/options.h"
#include "ferry/rpc/rpc.h"
#include "trainer/rebalance.h"
#include "trainer/stage_plan.h"

namespace ferry::bench {
namespace {

struct Config {
  std::string name;  // naive | gpipe | 1f1b | zb
  pipeline::Schedule schedule;
  int microbatches;
  std::unique_ptr<pipeline::Pipeline> pipe;
  std::vector<double> steps;
  std::vector<double> activation_mib;
  std::vector<double> tensor_mib;
  // The timeline before the steps measured and after each: set at the end of the untimed steps
  // (and before a re-balancing look's step); each step adds one once it is set.
  std::vector<pipeline::TimelineReport> marks;
};

// Per stage, the median over the steps between `marks` (one disturbed step does not move a median,
// as it does a mean): compute (forward, backward and deferred weight passes) per step, and the
// share of the step's wall time it idled.
struct StageFigures {
  std::vector<double> compute_s, idle_share;
  std::vector<double> forward_s, backward_s, weight_s;  // the parts of compute_s
};

StageFigures stage_figures(const Config& c) {
  StageFigures out;
  if (c.marks.size() < 2) return out;
  const size_t stages = c.marks.back().per_stage.size();
  std::vector<std::vector<double>> compute(stages), idle(stages), forward(stages), backward(stages),
      weight(stages);
  for (size_t i = 1; i < c.marks.size(); ++i) {
    const pipeline::TimelineReport& then = c.marks[i - 1];
    const pipeline::TimelineReport& now = c.marks[i];
    const int steps = now.steps - then.steps;
    const double wall = now.wall_s - then.wall_s;
    if (steps <= 0 || wall <= 0) continue;
    for (size_t k = 0; k < stages; ++k) {
      const pipeline::StageReport& a =
          k < then.per_stage.size() ? then.per_stage[k] : pipeline::StageReport{};
      const pipeline::StageReport& b = now.per_stage[k];
      forward[k].push_back((b.forward_s - a.forward_s) / steps);
      backward[k].push_back((b.backward_s - a.backward_s) / steps);
      weight[k].push_back((b.weight_s - a.weight_s) / steps);
      compute[k].push_back((b.compute_s() - a.compute_s()) / steps);
      idle[k].push_back((b.idle_s - a.idle_s) / wall);
    }
  }
  auto medians = [](const std::vector<std::vector<double>>& per_stage) {
    std::vector<double> m;
    for (const std::vector<double>& v : per_stage) m.push_back(v.empty() ? 0 : median(v));
    return m;
  };
  out.compute_s = medians(compute);
  out.idle_share = medians(idle);
  out.forward_s = medians(forward);
  out.backward_s = medians(backward);
  out.weight_s = medians(weight);
  return out;
}

// A pipeline per configuration over `model`'s stages: naive, then GPipe, 1F1B and zero-bubble at
// each M.
std::vector<Config> make_configs(const PipelineBenchSettings& s, const Model& model) {
  std::vector<Config> configs;
  configs.push_back({"naive", pipeline::Schedule::GPipe, 1, nullptr, {}, {}, {}, {}});
  for (pipeline::Schedule schedule :
       {pipeline::Schedule::GPipe, pipeline::Schedule::OneFOneB, pipeline::Schedule::ZeroBubble}) {
    for (int m : s.microbatches)
      configs.push_back({pipeline::schedule_name(schedule), schedule, m, nullptr, {}, {}, {}, {}});
  }
  for (Config& c : configs) {
    pipeline::PipelineOptions options;
    options.schedule = c.schedule;
    options.microbatches = c.microbatches;
    options.routes = model.routes;
    if (s.loss_on != trainer::LossPlacement::Master) options.loss = model.loss_name;
    c.pipe = std::make_unique<pipeline::Pipeline>(model.stages, options);
    c.activation_mib.assign(model.stages.size(), 0);
    c.tensor_mib.assign(model.stages.size(), 0);
  }
  return configs;
}

// The cut that the last configuration's stages (zero-bubble at the most micro-batches) measured in
// their latest step calls for (trainer/rebalance.h), or `plan` when no cut shortens its
// slowest stage by kMinGain. `blocks`: each block's compute in that step as its stage timed it
// (the plan's estimates stand in when empty). `record` says what was measured (each block's
// estimated and measured compute beside) and decided.
trainer::StagePlan rebalanced(const PipelineBenchSettings& s, const trainer::StagePlan& plan,
                              Config& last, const std::vector<double>& blocks,
                              nlohmann::ordered_json& record) {
  const StageFigures measured = stage_figures(last);
  const std::vector<pipeline::Range> current = plan.ranges();
  const bool timed = blocks.size() == plan.costs.size();
  const std::vector<double> estimated =
      trainer::block_compute_s(plan, s.batch, last.microbatches, false);
  const std::vector<double> calibrated =
      trainer::calibrated_block_s(timed ? blocks : estimated, current, measured.compute_s);
  const trainer::Recut recut = trainer::propose_recut(calibrated, measured.compute_s);
  record = {{"block_costs", timed ? "measured in the stages" : "estimated"},
            {"measured_compute_s", measured.compute_s},
            {"predicted_compute_s", recut.predicted_s},
            {"moved", recut.moves(current) && recut.worth_it()},
            {"blocks_s", nlohmann::ordered_json::array()}};
  for (size_t k = 0; k < estimated.size(); ++k) {
    record["blocks_s"].push_back({{"name", plan.costs[k].name},
                                  {"estimated", estimated[k]},
                                  {"measured", timed ? blocks[k] : 0.0}});
  }
  if (!record["moved"].get<bool>()) return plan;
  trainer::StagePlan to = trainer::recut(plan, unet_plan_settings(s), recut.ranges,
                                         "re-balanced from measured compute");
  record["blocks"] = trainer::describe_move(plan, to);
  std::cerr << "re-balanced: " << record["blocks"].get<std::string>() << "\n";
  return to;
}

// One step of `c`'s pipeline; a timed one adds its time and the stages' memory peaks.
void pipeline_step(Config& c, const Model& model, bool timed) {
  c.pipe->memory_peaks();  // starts this step's peaks
  double seconds;
  {
    dist_autograd::Context context;
    seconds = seconds_of([&] {
      if (!c.pipe->options().loss.empty()) {
        c.pipe->step(model.input, model.target);
      } else {
        c.pipe->step(model.input, model.target, model.loss);
      }
    });
  }
  std::vector<pipeline::Pipeline::StageMemory> peaks = c.pipe->memory_peaks();
  if (!c.marks.empty()) c.marks.push_back(c.pipe->timeline().report());
  if (!timed) return;
  c.steps.push_back(seconds);
  for (size_t k = 0; k < peaks.size(); ++k) {
    c.activation_mib[k] = std::max(c.activation_mib[k], peaks[k].activation_mib);
    c.tensor_mib[k] = std::max(c.tensor_mib[k], peaks[k].tensor_mib);
  }
}

// One configuration's figures over the timed steps; `naive` is the naive split's median step.
// `predicted`: each stage's compute as the re-balancing look predicted it for the cut that runs,
// when `c` is the configuration it measured; else empty.
nlohmann::ordered_json result_of(const PipelineBenchSettings& s, int p,
                                 const trainer::StagePlan& plan, const Config& c, double naive,
                                 const LocalSteps& local, const std::vector<double>& predicted) {
  const double step = median(c.steps);
  const double local_s = median(local.whole);
  const double ideal = static_cast<double>(p) * c.microbatches / (c.microbatches + p - 1);
  pipeline::TimelineReport report = c.pipe->timeline().report();
  const StageFigures stages = stage_figures(c);
  const double slowest = *std::max_element(stages.compute_s.begin(), stages.compute_s.end());
  std::vector<double> share_of_slowest;
  double summed = 0;
  for (double compute : stages.compute_s) {
    share_of_slowest.push_back(slowest > 0 ? compute / slowest : 0);
    summed += compute;
  }
  const double local_at_m =
      c.microbatches > 1 ? median(local.microbatched.at(c.microbatches)) : local_s;
  nlohmann::ordered_json result{{"schedule", c.name},
                                {"microbatches", c.microbatches},
                                {"step_s", step},
                                {"throughput", s.batch / step},
                                {"speedup", naive / step},
                                {"speedup_over_local", local_s / step},
                                {"ideal_speedup", ideal},
                                {"share_of_ideal", naive / step / ideal},
                                {"bubble", report.bubble},
                                {"ideal_bubble", report.ideal_bubble},
                                {"stage_compute_s", stages.compute_s},
                                {"stage_forward_s", stages.forward_s},
                                {"stage_backward_s", stages.backward_s},
                                {"stage_weight_s", stages.weight_s},
                                {"share_of_slowest", share_of_slowest},
                                {"idle_share", stages.idle_share},
                                {"summed_compute_over_local", summed / local_s},
                                {"local_microbatched_step_s", local_at_m},
                                {"microbatching_over_local", local_at_m / local_s},
                                {"summed_compute_over_local_microbatched", summed / local_at_m},
                                {"peak_activation_mib", c.activation_mib},
                                {"peak_tensor_mib", c.tensor_mib}};
  auto beside = local.microbatched_beside.find(c.microbatches);
  if (beside != local.microbatched_beside.end()) {
    const double local_beside = median(beside->second);
    result["local_microbatched_beside_s"] = local_beside;
    result["beside_over_alone"] = local_beside / local_at_m;
    result["summed_compute_over_local_microbatched_beside"] = summed / local_beside;
  }
  // Each stage's measured compute over what was expected of it, and the same over the machine's
  // drift since then.
  auto measured_over = [&stages](const std::vector<double>& expected, double drift) {
    std::vector<double> ratio, without_drift;
    for (size_t k = 0; k < expected.size() && k < stages.compute_s.size(); ++k) {
      ratio.push_back(expected[k] > 0 ? stages.compute_s[k] / expected[k] : 0);
      without_drift.push_back(drift > 0 ? ratio.back() / drift : 0);
    }
    return std::make_pair(ratio, without_drift);
  };
  if (s.model == "unet") {
    const std::vector<double> estimated =
        trainer::stage_compute_s(plan, s.batch, c.microbatches, false);
    const auto [ratio, without_drift] =
        measured_over(estimated, drift_since(local, local.whole_at_plan));
    result["estimated_compute_s"] = estimated;
    result["measured_over_estimated"] = ratio;
    result["measured_over_estimated_without_drift"] = without_drift;
  }
  if (!predicted.empty()) {
    const auto [ratio, without_drift] =
        measured_over(predicted, drift_since(local, local.whole_at_look));
    result["predicted_compute_s"] = predicted;
    result["measured_over_predicted"] = ratio;
    result["measured_over_predicted_without_drift"] = without_drift;
  }
  return result;
}

// The benchmark's JSON: the run, and each configuration's figures. `rebalance`: what the
// re-balancing look measured and decided, when it looked.
nlohmann::ordered_json report(const PipelineBenchSettings& s, int p, bool pinned,
                              const trainer::StagePlan& plan, const Model& model,
                              const std::vector<Config>& configs, const LocalSteps& local,
                              const nlohmann::ordered_json* rebalance) {
  const double naive = median(configs.front().steps);
  nlohmann::ordered_json out;
  out["benchmark"] = "pipeline";
  out["model"] = model.name;
  out["p"] = p;
  if (s.model == "unet") {
    out["plan"] = trainer::plan_json(plan);
    out["blocks_timed_beside"] = unet_plan_settings(s).neighbours;
  }
  if (rebalance != nullptr) {
    out["rebalance"] = *rebalance;
    out["drift_since_look"] = drift_since(local, local.whole_at_look);
  }
  if (s.model == "unet") out["drift_since_plan"] = drift_since(local, local.whole_at_plan);
  out["batch"] = s.batch;
  out["pinned"] = pinned;
  out["threads_per_process"] = 1;
  out["steps"] = s.steps;
  out["loss_on"] = core::name_of(trainer::loss_placement_names(), s.loss_on);
  out["timed"] = "Pipeline::step: forward and backward of one batch, medians";
  out["local_step_s"] = median(local.whole);
  out["naive_over_local"] = naive / median(local.whole);
  out["results"] = nlohmann::ordered_json::array();
  const std::vector<double> none;
  std::vector<double> predicted;
  if (rebalance != nullptr) {
    predicted = rebalance->at("predicted_compute_s").get<std::vector<double>>();
  }
  for (const Config& c : configs) {
    out["results"].push_back(
        result_of(s, p, plan, c, naive, local, &c == &configs.back() ? predicted : none));
  }
  return out;
}

// Steps every configuration in turns with the one-process baselines, re-balances once after the
// warm-up (a U-Net cut by time), and reports the timed steps.
nlohmann::ordered_json measure(const PipelineBenchSettings& s, int p, bool pinned,
                               trainer::StagePlan plan) {
  Model model = build(s, p, plan);
  std::vector<Config> configs = make_configs(s, model);
  LocalSteps local;
  // Re-balancing (a U-Net cut by time) measures one more step after the warm-up, moves, and warms
  // the new stages up again.
  const bool rebalance = s.rebalance && s.model == "unet" && p > 1;
  const int untimed = rebalance ? 2 * s.warmup + 1 : s.warmup;
  if (s.model == "unet") {
    // The machine's speed when the blocks were timed, a few seconds ago: a warm one-process step
    // (the first pays for fresh pages).
    local_step_s(model, 1, false);
    local.whole_at_plan = local_step_s(model, 1, false);
  }
  nlohmann::ordered_json rebalance_record;
  for (int round = 0; round < untimed + s.steps; ++round) {
    const bool timed = round >= untimed;
    const bool looks = rebalance && round == s.warmup;
    if (looks) configs.back().marks = {configs.back().pipe->timeline().report()};
    std::vector<double> blocks;
    for (Config& c : configs) {
      if (looks && &c == &configs.back()) blocks = trainer::measured_block_s(model.stages);
      pipeline_step(c, model, timed);
    }
    if (looks) {
      const std::vector<double> after = trainer::measured_block_s(model.stages);
      for (std::size_t k = 0; k < blocks.size() && k < after.size(); ++k)
        blocks[k] = after[k] - blocks[k];
    }
    const double whole = local_round(s, model, timed, local);
    if (looks) {
      local.whole_at_look = whole;
      trainer::StagePlan to = rebalanced(s, plan, configs.back(), blocks, rebalance_record);
      if (rebalance_record["moved"].get<bool>()) {
        configs.clear();
        plan = std::move(to);
        model = build(s, p, plan);
        configs = make_configs(s, model);
      }
    }
    if (round + 1 == untimed) {
      for (Config& c : configs) c.marks = {c.pipe->timeline().report()};
    }
    std::cerr << fmt::format("round {}: naive {:.3f} s, {} {}: {:.3f} s, one process {:.3f} s\n",
                             round,
                             configs.front().steps.empty() ? 0 : configs.front().steps.back(),
                             configs.back().name, configs.back().microbatches,
                             configs.back().steps.empty() ? 0 : configs.back().steps.back(), whole);
  }
  if (!s.trace_file.empty()) configs.back().pipe->timeline().write_chrome_trace(s.trace_file);
  return report(s, p, pinned, plan, model, configs, local, rebalance ? &rebalance_record : nullptr);
}

}  // namespace

int run_pipeline_bench(const PipelineBenchSettings& s) {
  if (s.model != "synthetic" && s.model != "unet") {
    std::cerr << "--model must be synthetic or unet\n";
    return 2;
  }
  at::set_num_threads(1);
  trainer::StagePlan plan;
  if (s.model == "unet") plan = trainer::plan_stages(unet_plan_settings(s));
  const int p =
      s.model == "unet" ? static_cast<int>(plan.stages.size()) : (s.stages == 0 ? 2 : s.stages);
  if (p < 1) {
    std::cerr << "--stages must be at least 1\n";
    return 2;
  }
  dist_autograd::install(rpc::default_registry());
  pipeline::install(rpc::default_registry());
  models::register_unet_stages();
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const bool pinned = s.pin && p <= cores;
  if (s.pin && !pinned) {
    std::cerr << fmt::format("{} stages on {} cores: not pinned\n", p, cores);
  }
  const core::PortFile port_file;
  std::vector<pid_t> workers;
  std::string worker_binary = core::executable_dir() + "/ferry-worker";
  for (int rank = 1; rank <= p; ++rank) {
    auto env = core::loopback_world_env(rank, p + 1, 0, port_file.path());
    env["OMP_NUM_THREADS"] = "1";
    env["FERRY_LOG_LEVEL"] = "warn";
    std::vector<std::string> args = {"--name", fmt::format("worker{}", rank)};
    if (pinned) {
      args.insert(args.begin(), {"-c", std::to_string(rank - 1), worker_binary});
      workers.push_back(spawn_process("/usr/bin/taskset", args, env));
    } else {
      workers.push_back(spawn_process(worker_binary, args, env));
    }
  }
  init_loopback_master("master", p + 1, port_file.path());
  int code = 0;
  nlohmann::ordered_json out;
  try {
    out = measure(s, p, pinned, plan);
  } catch (const std::exception& e) {
    std::cerr << "pipeline benchmark failed: " << e.what() << "\n";
    code = 1;
  }
  rpc::shutdown(code == 0);
  for (pid_t pid : workers) reap_process(pid);
  if (code == 0) std::cout << out.dump() << std::endl;
  return code;
}

}  // namespace ferry::bench
