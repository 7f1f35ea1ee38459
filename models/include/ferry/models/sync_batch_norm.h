// A 2-D batch norm that can take its statistics over a whole step (ferry/remote_module/
// step_statistics.h), as PyTorch's SyncBatchNorm does across processes and torchgpipe's deferred
// batch norm across micro-batches. Until a stage hands it the step's statistics it computes as
// torch::nn::BatchNorm2d does, with the same options, parameters, buffers and names, so weights
// and checkpoints do not care which one a model was built with.
//
// With step statistics, in training:
// - each forward normalises by the mean and variance of the batches of every replica together
//   (their counts and sums, then their squared deviations from the mean, summed over the
//   replicas), and its backward sums the gradient's own two sums over the replicas, so each
//   replica gets its share of the gradient of the whole step's loss;
// - the running statistics move once per step (ForwardPass::step), by the step's micro-batches
//   together, and not at all in a recomputation.
// Every replica must run the same layers in the same order, forwards and backwards alike.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <ostream>

#include "ferry/remote_module/step_statistics.h"

namespace ferry::models {

// Per channel, float64: how many values, their mean, and the sum of their squared deviations
// from it.
struct BatchStatistics {
  double count = 0;
  at::Tensor mean, m2;
};

class SyncBatchNorm2dImpl : public torch::nn::Cloneable<SyncBatchNorm2dImpl>,
                            public remote_module::StepStatistics {
 public:
  explicit SyncBatchNorm2dImpl(int64_t features)
      : SyncBatchNorm2dImpl(torch::nn::BatchNormOptions(features)) {}
  explicit SyncBatchNorm2dImpl(const torch::nn::BatchNormOptions& options);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  at::Tensor forward(const at::Tensor& input);
  void take_step_statistics(remote_module::SumOverReplicas sum) override;

  torch::nn::BatchNormOptions options;
  at::Tensor weight, bias;                                    // undefined unless affine
  at::Tensor running_mean, running_var, num_batches_tracked;  // undefined unless tracked

 private:
  at::Tensor forward_over_step(const at::Tensor& input);
  void update_running_statistics(const BatchStatistics& batch, std::int64_t step);

  bool step_statistics_ = false;
  remote_module::SumOverReplicas sum_;
  std::int64_t step_ = 0;                // the step `step_stats_` is of; 0: none
  BatchStatistics step_stats_;           // over the step's forwards so far
  at::Tensor mean_before_, var_before_;  // the running statistics before the step
};
TORCH_MODULE(SyncBatchNorm2d);

}  // namespace ferry::models
