#include "bench/pipeline_bench.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/processes.h"
#include "bench/stats.h"
#include "ferry/core/local_world.h"
#include "ferry/core/process_memory.h"
#include "ferry/dist_autograd/context.h"
#include "ferry/models/remote_unet.h"
#include "ferry/pipeline/pipeline.h"
#include "ferry/rpc/options.h"
#include "ferry/rpc/rpc.h"
#include "ferry/trainer/stage_plan.h"

namespace ferry::bench {
namespace {

struct Config {
  std::string name;  // naive | gpipe | 1f1b
  pipeline::Schedule schedule;
  int microbatches;
  std::unique_ptr<pipeline::Pipeline> pipe;
  std::vector<double> steps;
  std::vector<double> activation_mib;
  std::vector<double> tensor_mib;
};

remote_module::StageConfig synthetic_config(const PipelineBenchSettings& s, int index) {
  remote_module::StageConfig config = remote_module::stage_config();
  config.insert("width", static_cast<int64_t>(s.width));
  config.insert("layers", static_cast<int64_t>(s.layers));
  config.insert("seed", static_cast<int64_t>(index));
  return config;
}

// The stages on worker1..p, and the same model in this process for the one-process baseline.
struct Model {
  std::vector<remote_module::RemoteModule> stages;
  remote_module::Routes routes;  // the U-Net's skips go straight to the stage that uses them
  std::function<at::Tensor(const at::Tensor&)> local_forward;
  std::vector<at::Tensor> local_parameters;
  at::Tensor input, target;
  pipeline::Pipeline::Loss loss;
  std::string name;
};

// The U-Net's cut, measured and balanced here before any worker starts.
trainer::StagePlan unet_plan(const PipelineBenchSettings& s) {
  trainer::PlanSettings plan;
  plan.model = fmt::format("unet-resnet{}", s.depth);
  plan.image_size = s.image_size;
  plan.batch_size = s.batch;
  plan.stages = s.stages;
  plan.balance = s.balance;
  return trainer::plan_stages(plan);
}

std::vector<std::string> worker_names(int p) {
  std::vector<std::string> out;
  for (int k = 1; k <= p; ++k) out.push_back(fmt::format("worker{}", k));
  return out;
}

Model build(const PipelineBenchSettings& s, int p, const trainer::StagePlan& plan) {
  Model m;
  torch::manual_seed(0);
  if (s.model == "unet") {
    auto split = std::make_shared<models::RemoteUnet>(
        models::RemoteUnet::create(s.depth, 1, plan.on(worker_names(p))));
    for (const auto& stage : split->stages()) m.stages.push_back(stage.module);
    m.routes = split->routes();
    auto local = std::make_shared<models::Unet>(split->local_copy());
    m.local_forward = [local](const at::Tensor& x) { return (*local)->forward(x); };
    m.local_parameters = (*local)->parameters();
    m.input = torch::randn({s.batch, 3, s.image_size, s.image_size});
    m.target = (torch::rand({s.batch, 1, s.image_size, s.image_size}) > 0.5).to(torch::kFloat);
    m.loss = [](const at::Tensor& out, const at::Tensor& target) {
      return torch::binary_cross_entropy_with_logits(out, target);
    };
    m.name = fmt::format("unet-resnet{} ({})", s.depth, plan.method);
    return m;
  }
  std::vector<std::shared_ptr<remote_module::Stage>> local;
  for (int k = 0; k < p; ++k) {
    m.stages.push_back(remote_module::RemoteModule::create(
        fmt::format("worker{}", k + 1), "synthetic.mlp", synthetic_config(s, k)));
    local.push_back(remote_module::make_stage("synthetic.mlp", synthetic_config(s, k)));
    for (auto& [name, t] : local.back()->named_parameters()) m.local_parameters.push_back(t);
  }
  m.local_forward = [local](const at::Tensor& x) {
    c10::IValue h = x;
    for (auto& stage : local) h = stage->forward({h});
    return h.toTensor();
  };
  m.input = torch::randn({s.batch, s.width});
  m.target = torch::randn({s.batch, s.width});
  m.loss = [](const at::Tensor& out, const at::Tensor& target) {
    return torch::mse_loss(out, target);
  };
  m.name = fmt::format("synthetic.mlp ({} layers of {} features per stage)", s.layers, s.width);
  return m;
}

nlohmann::ordered_json measure(const PipelineBenchSettings& s, int p, bool pinned,
                               const trainer::StagePlan& plan) {
  Model model = build(s, p, plan);
  std::vector<Config> configs;
  configs.push_back({"naive", pipeline::Schedule::GPipe, 1, nullptr, {}, {}, {}});
  for (pipeline::Schedule schedule : {pipeline::Schedule::GPipe, pipeline::Schedule::OneFOneB}) {
    for (int m : s.microbatches)
      configs.push_back({pipeline::schedule_name(schedule), schedule, m, nullptr, {}, {}, {}});
  }
  for (Config& c : configs) {
    pipeline::PipelineOptions options;
    options.schedule = c.schedule;
    options.microbatches = c.microbatches;
    options.routes = model.routes;
    c.pipe = std::make_unique<pipeline::Pipeline>(model.stages, options);
    c.activation_mib.assign(model.stages.size(), 0);
    c.tensor_mib.assign(model.stages.size(), 0);
  }
  std::vector<double> local_steps;
  for (int round = 0; round < s.warmup + s.steps; ++round) {
    bool timed = round >= s.warmup;
    for (Config& c : configs) {
      c.pipe->memory_peaks();  // starts this step's peaks
      double seconds;
      {
        dist_autograd::Context context;
        seconds = seconds_of([&] { c.pipe->step(model.input, model.target, model.loss); });
      }
      std::vector<pipeline::Pipeline::StageMemory> peaks = c.pipe->memory_peaks();
      if (!timed) continue;
      c.steps.push_back(seconds);
      for (size_t k = 0; k < peaks.size(); ++k) {
        c.activation_mib[k] = std::max(c.activation_mib[k], peaks[k].activation_mib);
        c.tensor_mib[k] = std::max(c.tensor_mib[k], peaks[k].tensor_mib);
      }
    }
    double local = seconds_of([&] {
      for (auto& t : model.local_parameters) t.mutable_grad() = at::Tensor();
      model.loss(model.local_forward(model.input), model.target).backward();
    });
    if (timed) local_steps.push_back(local);
    std::cerr << fmt::format("round {}: naive {:.3f} s, {} {}: {:.3f} s, one process {:.3f} s\n",
                             round,
                             configs.front().steps.empty() ? 0 : configs.front().steps.back(),
                             configs.back().name, configs.back().microbatches,
                             configs.back().steps.empty() ? 0 : configs.back().steps.back(), local);
  }
  if (!s.trace_file.empty()) configs.back().pipe->timeline().write_chrome_trace(s.trace_file);
  double naive = median(configs.front().steps);
  nlohmann::ordered_json out;
  out["benchmark"] = "pipeline";
  out["model"] = model.name;
  out["p"] = p;
  if (s.model == "unet") out["plan"] = trainer::plan_json(plan);
  out["batch"] = s.batch;
  out["pinned"] = pinned;
  out["threads_per_process"] = 1;
  out["steps"] = s.steps;
  out["timed"] = "Pipeline::step: forward and backward of one batch, medians";
  out["local_step_s"] = median(local_steps);
  out["naive_over_local"] = naive / median(local_steps);
  out["results"] = nlohmann::ordered_json::array();
  for (const Config& c : configs) {
    double step = median(c.steps);
    double ideal = static_cast<double>(p) * c.microbatches / (c.microbatches + p - 1);
    pipeline::TimelineReport report = c.pipe->timeline().report();
    out["results"].push_back({{"schedule", c.name},
                              {"microbatches", c.microbatches},
                              {"step_s", step},
                              {"throughput", s.batch / step},
                              {"speedup", naive / step},
                              {"ideal_speedup", ideal},
                              {"share_of_ideal", naive / step / ideal},
                              {"bubble", report.bubble},
                              {"ideal_bubble", report.ideal_bubble},
                              {"peak_activation_mib", c.activation_mib},
                              {"peak_tensor_mib", c.tensor_mib}});
  }
  return out;
}

}  // namespace

int run_pipeline_bench(const PipelineBenchSettings& s) {
  if (s.model != "synthetic" && s.model != "unet") {
    std::cerr << "--model must be synthetic or unet\n";
    return 2;
  }
  at::set_num_threads(1);
  trainer::StagePlan plan;
  if (s.model == "unet") plan = unet_plan(s);
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
  int port = core::pick_free_port();
  std::vector<pid_t> workers;
  std::string worker_binary = binary_dir(s.self_path) + "/ferry-worker";
  for (int rank = 1; rank <= p; ++rank) {
    auto env = core::loopback_world_env(rank, p + 1, port);
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
  init_loopback_master("master", p + 1, port);
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
