#include "bench/pipeline_model.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <set>
#include <thread>

#include "bench/stats.h"
#include "ferry/core/neighbours.h"
#include "ferry/models/remote_unet.h"
#include "ferry/remote_module/loss.h"

namespace ferry::bench {
namespace {

remote_module::StageConfig synthetic_config(const PipelineBenchSettings& s, int index) {
  remote_module::StageConfig config = remote_module::stage_config();
  config.insert("width", static_cast<int64_t>(s.width));
  config.insert("layers", static_cast<int64_t>(s.layers));
  config.insert("seed", static_cast<int64_t>(index));
  return config;
}

std::vector<std::string> worker_names(int p) {
  std::vector<std::string> out;
  for (int k = 1; k <= p; ++k) out.push_back(fmt::format("worker{}", k));
  return out;
}

// One step of `local` over the model's batch, one micro-batch after another: what micro-batching
// itself costs the same blocks, without any stage boundary. Ends early, between micro-batches,
// once `stop` is set.
void local_pass(const Model& model, LocalModel& local, int microbatches,
                const std::atomic<bool>* stop = nullptr) {
  for (auto& t : local.parameters) t.mutable_grad() = at::Tensor();
  std::vector<at::Tensor> inputs = model.input.tensor_split(microbatches);
  std::vector<at::Tensor> targets = model.target.tensor_split(microbatches);
  for (size_t m = 0; m < inputs.size(); ++m) {
    if (stop != nullptr && *stop) return;
    model.loss(local.forward(inputs[m]), targets[m]).backward();
  }
}

}  // namespace

int neighbours(const PipelineBenchSettings& s, int p) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return s.pin && p >= 2 && p <= cores ? p - 1 : 0;
}

trainer::PlanSettings unet_plan_settings(const PipelineBenchSettings& s) {
  trainer::PlanSettings plan;
  plan.model = fmt::format("unet-resnet{}", s.depth);
  plan.image_size = s.image_size;
  plan.batch_size = s.batch;
  plan.stages = s.stages;
  plan.balance = s.balance;
  plan.microbatches = *std::max_element(s.microbatches.begin(), s.microbatches.end());
  plan.threads = 1;
  plan.neighbours = neighbours(s, s.stages);
  return plan;
}

Model build(const PipelineBenchSettings& s, int p, const trainer::StagePlan& plan) {
  Model m;
  torch::manual_seed(0);
  if (s.model == "unet") {
    auto split = std::make_shared<models::RemoteUnet>(
        models::RemoteUnet::create(s.depth, 1, plan.on(worker_names(p))));
    for (const auto& stage : split->stages()) m.stages.push_back(stage.module);
    m.routes = split->routes();
    auto local_unet = [&split] {
      auto net = std::make_shared<models::Unet>(split->local_copy());
      return LocalModel{[net](const at::Tensor& x) { return (*net)->forward(x); },
                        (*net)->parameters()};
    };
    m.local = local_unet();
    for (int k = 0; k < neighbours(s, p); ++k) m.neighbours.push_back(local_unet());
    m.input = torch::randn({s.batch, 3, s.image_size, s.image_size});
    m.target = (torch::rand({s.batch, 1, s.image_size, s.image_size}) > 0.5).to(torch::kFloat);
    m.loss_name = "bce";
    m.loss = remote_module::loss_function(m.loss_name);
    m.name = fmt::format("unet-resnet{} ({})", s.depth, plan.method);
    return m;
  }
  for (int k = 0; k < p; ++k) {
    m.stages.push_back(remote_module::RemoteModule::create(
        fmt::format("worker{}", k + 1), "synthetic.mlp", synthetic_config(s, k)));
  }
  auto local_mlp = [&s, p] {
    std::vector<std::shared_ptr<remote_module::Stage>> stages;
    LocalModel local;
    for (int k = 0; k < p; ++k) {
      stages.push_back(remote_module::make_stage("synthetic.mlp", synthetic_config(s, k)));
      for (auto& [name, t] : stages.back()->named_parameters()) local.parameters.push_back(t);
    }
    local.forward = [stages](const at::Tensor& x) {
      c10::IValue h = x;
      for (auto& stage : stages) h = stage->forward({h});
      return h.toTensor();
    };
    return local;
  };
  m.local = local_mlp();
  for (int k = 0; k < neighbours(s, p); ++k) m.neighbours.push_back(local_mlp());
  m.input = torch::randn({s.batch, s.width});
  m.target = torch::randn({s.batch, s.width});
  m.loss_name = "mse";
  m.loss = remote_module::loss_function(m.loss_name);
  m.name = fmt::format("synthetic.mlp ({} layers of {} features per stage)", s.layers, s.width);
  return m;
}

double local_step_s(Model& model, int microbatches, bool beside) {
  core::Neighbours others(beside ? static_cast<int>(model.neighbours.size()) : 0,
                          [&](int k, const std::atomic<bool>& stop) {
                            local_pass(model, model.neighbours[k], microbatches, &stop);
                          });
  const double seconds = seconds_of([&] { local_pass(model, model.local, microbatches); });
  others.stop();
  return seconds;
}

double drift_since(const LocalSteps& local, double then) {
  return then > 0 ? median(local.whole) / then : 0;
}

double local_round(const PipelineBenchSettings& s, Model& model, bool timed, LocalSteps& local) {
  const double whole = local_step_s(model, 1, false);
  if (timed) local.whole.push_back(whole);
  for (int m : std::set<int>(s.microbatches.begin(), s.microbatches.end())) {
    if (m <= 1) continue;
    const double seconds = local_step_s(model, m, false);
    if (timed) local.microbatched[m].push_back(seconds);
  }
  const int most = *std::max_element(s.microbatches.begin(), s.microbatches.end());
  if (!model.neighbours.empty() && most > 1) {
    const double seconds = local_step_s(model, most, true);
    if (timed) local.microbatched_beside[most].push_back(seconds);
  }
  return whole;
}

}  // namespace ferry::bench
