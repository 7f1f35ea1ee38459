// The device path itself, which no CPU machine can run: a stage on worker/cuda:0 computes what the
// same stage computes on the CPU, forward, distributed backward and optimizer step; under
// bf16-mixed it runs in CUDA's autocast; a pipeline mixes it with CPU stages. Built only with
// -DFERRY_CUDA_TESTS=ON, on a machine with a CUDA LibTorch and a GPU; there, without a device,
// these tests fail rather than skip.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "ferry/dist_autograd/context.h"
#include "ferry/dist_autograd/optimizer.h"
#include "ferry/models/compare.h"
#include "ferry/pipeline/pipeline.h"
#include "ferry/remote_module/remote_module.h"
#include "tests/support/cluster.h"
#include "tests/support/test_stages.h"

namespace ferry::remote_module {
namespace {

using testing::LocalWorld;
using testing::mlp_config;

// Two MLP stages, the first on `first_device` of worker a, the second on b's CPU.
struct TwoStages {
  explicit TwoStages(const std::string& first_device)
      : first(RemoteModule::create("a", "test.mlp", mlp_config(6, 32, 16, 5))),
        second(RemoteModule::create("b", "test.mlp", mlp_config(16, 32, 1, 6))) {
    first.to(first_device);
  }
  std::vector<rpc::RRefPtr> parameters() const {
    auto all = first.remote_parameters();
    for (auto& p : second.remote_parameters()) all.push_back(p);
    return all;
  }
  RemoteModule first;
  RemoteModule second;
};

void expect_same_weights(const RemoteModule& a, const RemoteModule& b, double tolerance) {
  c10::Dict<std::string, at::Tensor> wa = a.state_dict();
  c10::Dict<std::string, at::Tensor> wb = b.state_dict();
  ASSERT_EQ(wa.size(), wb.size());
  for (const auto& entry : wa) {
    const at::Tensor& other = wb.at(entry.key());
    EXPECT_TRUE(entry.value().device().is_cpu()) << entry.key();
    EXPECT_TRUE(torch::allclose(entry.value(), other, tolerance, tolerance))
        << entry.key() << ": largest difference "
        << (entry.value() - other).abs().max().item<double>();
  }
}

TEST(CudaStage, TheWorkerHasTheDevice) {
  ASSERT_TRUE(torch::cuda::is_available()) << "this test needs a CUDA device here";
  LocalWorld world;  // workers a and b
  TwoStages stages("cuda:0");
  StageStats stats = stages.first.stats();
  EXPECT_GT(stats.parameters, 0);
}

TEST(CudaStage, ForwardBackwardAndStepsMatchTheSameStagesOnTheCpu) {
  ASSERT_TRUE(torch::cuda::is_available()) << "this test needs a CUDA device here";
  LocalWorld world;  // workers a and b
  TwoStages gpu("cuda:0");
  TwoStages cpu("cpu");
  expect_same_weights(gpu.first, cpu.first, 0);
  auto spec = dist_autograd::OptimizerSpec::sgd(0.05, 0.9);
  dist_autograd::DistributedOptimizer gpu_optimizer(spec, gpu.parameters());
  dist_autograd::DistributedOptimizer cpu_optimizer(spec, cpu.parameters());
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(100 + step);
    at::Tensor x = torch::randn({8, 6});
    double losses[2];
    int k = 0;
    for (auto* run : {&gpu, &cpu}) {
      auto* optimizer = run == &gpu ? &gpu_optimizer : &cpu_optimizer;
      dist_autograd::Context context;
      at::Tensor y = run->second.forward({run->first.forward({x})}).toTensor();
      EXPECT_TRUE(y.device().is_cpu());
      at::Tensor loss = (y * y).mean();
      dist_autograd::backward(context.id(), {loss});
      optimizer->step(context.id());
      losses[k++] = loss.item<double>();
    }
    EXPECT_NEAR(losses[0], losses[1], 1e-4 * std::abs(losses[1]) + 1e-6) << "step " << step;
  }
  expect_same_weights(gpu.first, cpu.first, 1e-4);
  expect_same_weights(gpu.second, cpu.second, 1e-4);
}

TEST(CudaStage, BFloat16MixedRunsUnderCudaAutocastAndStillTrains) {
  ASSERT_TRUE(torch::cuda::is_available()) << "this test needs a CUDA device here";
  LocalWorld world;  // workers a and b
  TwoStages stages("cuda:0");
  torch::manual_seed(3);
  at::Tensor x = torch::randn({8, 6});
  at::Tensor full = stages.first.forward({x}).toTensor();
  stages.first.set_precision(Precision::BFloat16Mixed);
  at::Tensor half = stages.first.forward({x}).toTensor();
  EXPECT_EQ(half.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(torch::allclose(half.to(at::kFloat), full, 5e-2, 5e-2));
  // As train --precision does: every stage, so the next one takes bfloat16 in.
  stages.second.set_precision(Precision::BFloat16Mixed);
  c10::Dict<std::string, at::Tensor> before = stages.first.state_dict();
  dist_autograd::DistributedOptimizer optimizer(dist_autograd::OptimizerSpec::sgd(0.1, 0.0),
                                                stages.parameters());
  dist_autograd::Context context;
  at::Tensor y = stages.second.forward({stages.first.forward({x})}).toTensor();
  dist_autograd::backward(context.id(), {(y.to(at::kFloat) * y.to(at::kFloat)).mean()});
  optimizer.step(context.id());
  // Weights stay float32 and move.
  c10::Dict<std::string, at::Tensor> after = stages.first.state_dict();
  for (const auto& entry : after) {
    EXPECT_EQ(entry.value().scalar_type(), at::kFloat) << entry.key();
    EXPECT_FALSE(torch::equal(entry.value(), before.at(entry.key()))) << entry.key();
  }
}

TEST(CudaStage, APipelineWithAStageOnTheDeviceMatchesTheCpuOne) {
  ASSERT_TRUE(torch::cuda::is_available()) << "this test needs a CUDA device here";
  LocalWorld world;  // workers a and b
  TwoStages gpu("cuda:0");
  TwoStages cpu("cpu");
  torch::manual_seed(11);
  at::Tensor x = torch::randn({16, 6});
  at::Tensor target = torch::randn({16, 1});
  auto mse = [](const at::Tensor& out, const at::Tensor& t) { return torch::mse_loss(out, t); };
  for (auto schedule : {pipeline::Schedule::GPipe, pipeline::Schedule::OneFOneB}) {
    pipeline::PipelineOptions options;
    options.schedule = schedule;
    options.microbatches = 4;
    auto step = [&](TwoStages& stages, std::vector<at::Tensor>* grads) {
      pipeline::Pipeline pipe({stages.first, stages.second}, options);
      dist_autograd::Context context;
      double loss = pipe.step(x, target, mse).loss;
      *grads = dist_autograd::get_gradients(context.id(), stages.parameters());
      return loss;
    };
    std::vector<at::Tensor> gpu_grads, cpu_grads;
    double gpu_loss = step(gpu, &gpu_grads);
    double cpu_loss = step(cpu, &cpu_grads);
    EXPECT_NEAR(gpu_loss, cpu_loss, 1e-4 * std::abs(cpu_loss));
    EXPECT_LE(models::max_relative_error(gpu_grads, cpu_grads), 1e-3)
        << pipeline::schedule_name(schedule);
  }
}

}  // namespace
}  // namespace ferry::remote_module
