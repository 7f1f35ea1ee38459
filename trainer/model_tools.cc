#include "ferry/trainer/model_tools.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <memory>

#include "ferry/core/process_memory.h"
#include "ferry/core/processes.h"
#include "ferry/models/unet.h"
#include "ferry/models/unet_blocks.h"
#include "ferry/rpc/error.h"
#include "trainer/image_size_json.h"
#include "trainer/stage_plan.h"

namespace ferry::trainer {

int describe_model(const PlanSettings& settings, bool json, bool blocks) {
  StagePlan plan = plan_stages(settings);
  nlohmann::ordered_json out{{"model", settings.model},
                             {"image_size", settings.image_size},
                             {"batch_size", settings.batch_size}};
  out.update(plan_json(plan));
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> carry{
      torch::zeros({1, 3, settings.image_size.height, settings.image_size.width})};
  for (size_t k = 0; k < plan.stages.size(); ++k) {
    const PlannedStage& stage = plan.stages[k];
    models::UnetBlocks part(plan.depth, settings.classes, stage.first, stage.last);
    part->eval();
    int64_t bytes = 0;
    for (const auto& t : part->parameters()) bytes += static_cast<int64_t>(t.nbytes());
    for (const auto& t : part->buffers()) bytes += static_cast<int64_t>(t.nbytes());
    carry = part->forward(carry);
    nlohmann::ordered_json shapes = nlohmann::ordered_json::array();
    for (const auto& t : carry) shapes.push_back(t.sizes().vec());
    auto& entry = out["stages"][k];
    entry["type"] = "unet.blocks";
    entry["buffers"] = part->buffers().size();
    entry["bytes"] = bytes;
    entry["output_shapes"] = shapes;
  }
  if (blocks) {
    out["blocks"] = nlohmann::ordered_json::array();
    for (const auto& c : plan.costs) {
      out["blocks"].push_back(
          {{"name", c.name},
           {"parameters", c.parameters},
           {"activation_mib_per_sample", c.activation_bytes_per_sample / (1 << 20)},
           {"forward_fixed_ms", 1e3 * c.forward.fixed_s},
           {"forward_ms_per_sample", 1e3 * c.forward.per_sample_s},
           {"backward_fixed_ms", 1e3 * c.backward.fixed_s},
           {"backward_ms_per_sample", 1e3 * c.backward.per_sample_s}});
    }
  }
  if (json) {
    std::cout << out.dump() << std::endl;
    return 0;
  }
  std::cout << fmt::format("{} for {} inputs, batch {} ({})\n", settings.model,
                           settings.image_size.extent(), settings.batch_size, plan.method);
  std::cout << plan_table(plan);
  for (const auto& stage : out["stages"]) {
    std::cout << fmt::format("  {:<8} {:>4} buffers {:>8.1f} MiB  out (one image) {}\n",
                             stage["name"].get<std::string>(), stage["buffers"].get<int64_t>(),
                             stage["bytes"].get<int64_t>() / 1048576.0,
                             stage["output_shapes"].dump());
  }
  std::cout << fmt::format("  total    {:>11} parameters\n",
                           out["total_parameters"].get<int64_t>());
  if (blocks) {
    const models::CostSampling sampling =
        cost_sampling(settings.batch_size, settings.microbatches, settings.threads);
    std::cout << fmt::format("\n{:<12} {:>11} {:>18} {:>17} {:>17}\n", "block", "parameters",
                             "activations MiB/img", "forward ms", "backward ms");
    for (const auto& c : plan.costs) {
      std::cout << fmt::format(
          "{:<12} {:>11} {:>18.2f} {:>7.2f} + {:>5.2f}/img {:>7.2f} + "
          "{:>5.2f}/img\n",
          c.name, c.parameters, c.activation_bytes_per_sample / (1 << 20), 1e3 * c.forward.fixed_s,
          1e3 * c.forward.per_sample_s, 1e3 * c.backward.fixed_s, 1e3 * c.backward.per_sample_s);
    }
    std::cout << fmt::format(
        "times are a fixed part plus a part per image, fitted to each block timed on {} and {} "
        "images\n",
        sampling.samples, sampling.second_size());
  }
  return 0;
}

int measure_single_process(const std::string& model, int64_t classes,
                           const core::ImageSize& image_size, int64_t batch_size,
                           Optimizer optimizer_kind, int64_t memory_budget_mib) {
  core::count_tensor_memory();
  core::set_tensor_memory_budget(memory_budget_mib << 20);
  models::Unet net(depth_of(model), classes);
  at::Tensor x = torch::randn({batch_size, 3, image_size.height, image_size.width});
  at::Tensor target = torch::zeros({batch_size, classes, image_size.height, image_size.width});
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  switch (optimizer_kind) {
    case Optimizer::Sgd:
      optimizer = std::make_unique<torch::optim::SGD>(net->parameters(),
                                                      torch::optim::SGDOptions(0.01).momentum(0.9));
      break;
    case Optimizer::AdamW:
      optimizer = std::make_unique<torch::optim::AdamW>(net->parameters());
      break;
    case Optimizer::Adam:
      optimizer = std::make_unique<torch::optim::Adam>(net->parameters());
      break;
  }
  torch::binary_cross_entropy_with_logits(net->forward(x), target).backward();
  optimizer->step();
  nlohmann::ordered_json out{
      {"peak_rss_mib", core::peak_rss_mib()},
      {"peak_tensor_mib", static_cast<double>(core::tensor_memory().peak_bytes) / (1 << 20)}};
  std::cout << out.dump() << std::endl;
  return 0;
}

double single_process_peak_mib(const std::string& master_program, const PlanSettings& plan) {
  const core::CommandOutput ran =
      core::run_process({master_program, "footprint", "--model", plan.model, "--classes",
                         std::to_string(plan.classes), "--image-size", plan.image_size.text(),
                         "--batch-size", std::to_string(plan.batch_size), "--optimizer",
                         core::name_of(optimizer_names(), plan.optimizer)},
                        {{}, {"RANK", "WORLD_SIZE", "SLURM_PROCID"}}, /*with_stderr=*/false);
  if (ran.status != 0) return -1;
  try {
    return nlohmann::json::parse(ran.last_line()).at("peak_rss_mib").get<double>();
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace ferry::trainer
