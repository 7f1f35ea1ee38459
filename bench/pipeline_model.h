// The model `ferry-bench pipeline` runs: its stages on worker1..p, the same model in the master's
// process for the one-process baselines, and those baselines' steps (alone, micro-batched, and
// beside copies of the model, as pinned stages compute beside each other).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench/pipeline_bench.h"
#include "ferry/pipeline/pipeline.h"
#include "ferry/remote_module/remote_module.h"
#include "trainer/stage_plan.h"

namespace ferry::bench {

// How many stages compute beside each of `p` when each is pinned to a core of its own: p - 1,
// or none when they are not pinned.
int neighbours(const PipelineBenchSettings& s, int p);

// The U-Net's plan settings: blocks timed at the most micro-batches' size and four times it,
// with the stages' one thread, beside the stages that compute at once with each.
trainer::PlanSettings unet_plan_settings(const PipelineBenchSettings& s);

// The whole model in this process.
struct LocalModel {
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::vector<at::Tensor> parameters;
};

// The stages on worker1..p, and the same model in this process for the one-process baseline.
struct Model {
  std::vector<remote_module::RemoteModule> stages;
  remote_module::Routes routes;  // the U-Net's skips go straight to the stage that uses them
  LocalModel local;
  // More copies of it, which compute beside the baseline as the pinned stages compute beside
  // each other (neighbours() of them).
  std::vector<LocalModel> neighbours;
  at::Tensor input, target;
  std::string loss_name;  // registered (ferry/remote_module/loss.h)
  pipeline::Pipeline::Loss loss;
  std::string name;
};

// The U-Net cut by `plan`, or p synthetic stages, on worker1..p, with its copies here.
Model build(const PipelineBenchSettings& s, int p, const trainer::StagePlan& plan);

// Seconds of one step of the model in this process; `beside`: while its neighbours run steps of
// their copies, as the stages compute beside each other.
double local_step_s(Model& model, int microbatches, bool beside);

// One process's step times, whole and at each count of micro-batches, measured beside the
// pipelines' steps, in turns with them.
struct LocalSteps {
  std::vector<double> whole;
  std::map<int, std::vector<double>> microbatched;
  // At the most micro-batches, while the model's neighbours step their copies beside it, as
  // pinned stages compute beside each other. A copy of the whole model slows it more than the
  // run's stages slow each other (each copy's deepest blocks share the cache with the other's),
  // so this bounds the cost of computing side by side from above, as the step alone does from
  // below.
  std::map<int, std::vector<double>> microbatched_beside;
  double whole_at_plan = 0;  // a warm step just after the blocks were timed for the plan
  double whole_at_look = 0;  // the step beside the re-balancing look
};

// The machine's own drift since `then` (a one-process step measured when an estimate was made):
// the one-process step's median over the timed steps against it. A stage's compute drifts with
// it, which no estimate made then can know; 0 when nothing was measured then.
double drift_since(const LocalSteps& local, double then);

// A round's one-process steps: whole, at each count of micro-batches, and at the most beside the
// model's neighbours; a timed round's go into `local`. Returns the whole step's seconds.
double local_round(const PipelineBenchSettings& s, Model& model, bool timed, LocalSteps& local);

}  // namespace ferry::bench
