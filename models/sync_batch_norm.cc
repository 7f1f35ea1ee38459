#include "ferry/models/sync_batch_norm.h"

#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <torch/torch.h>

#include <stdexcept>
#include <utility>

namespace ferry::models {
namespace {

struct SumHolder : torch::CustomClassHolder {
  explicit SumHolder(SumOverReplicas s) : sum(std::move(s)) {}
  SumOverReplicas sum;
};

at::Tensor summed(const SumOverReplicas& sum, const at::Tensor& t) {
  std::vector<at::Tensor> tensors{t.contiguous()};
  sum(tensors);
  return tensors[0].view(t.sizes());
}

// The sum over the replicas, differentiable: every replica's output is the same sum, so the
// gradient of each replica's input is the sum of every replica's output gradient.
struct SumOverReplicasFunction : torch::autograd::Function<SumOverReplicasFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& local,
                            const SumOverReplicas& sum) {
    ctx->saved_data["sum"] = c10::IValue::make_capsule(c10::make_intrusive<SumHolder>(sum));
    return summed(sum, local);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto holder = c10::static_intrusive_pointer_cast<SumHolder>(ctx->saved_data["sum"].toCapsule());
    return {summed(holder->sum, grads[0]), at::Tensor()};
  }
};

}  // namespace

SyncBatchNorm2dImpl::SyncBatchNorm2dImpl(const torch::nn::BatchNormOptions& options)
    : options(options) {
  reset();
}

void SyncBatchNorm2dImpl::reset() {
  const int64_t n = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", torch::ones({n}));
    bias = register_parameter("bias", torch::zeros({n}));
  } else {
    weight = register_parameter("weight", at::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", at::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", torch::zeros({n}));
    running_var = register_buffer("running_var", torch::ones({n}));
    num_batches_tracked = register_buffer("num_batches_tracked", torch::tensor(0, torch::kLong));
  } else {
    running_mean = register_buffer("running_mean", at::Tensor());
    running_var = register_buffer("running_var", at::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", at::Tensor());
  }
}

void SyncBatchNorm2dImpl::pretty_print(std::ostream& stream) const {
  stream << "ferry::models::SyncBatchNorm2d(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine()
         << ", track_running_stats=" << options.track_running_stats()
         << ", step_statistics=" << step_statistics_ << ")";
}

void SyncBatchNorm2dImpl::take_step_statistics(SumOverReplicas sum) {
  step_statistics_ = true;
  sum_ = std::move(sum);
}

at::Tensor SyncBatchNorm2dImpl::forward(const at::Tensor& input) {
  if (input.dim() != 4) {
    throw std::invalid_argument(
        fmt::format("SyncBatchNorm2d: expected a 4-D input (N, C, H, W), got {}-D", input.dim()));
  }
  if (step_statistics_ && is_training()) return forward_over_step(input);
  // torch::nn::BatchNorm2d's own forward.
  double factor = 0;
  if (is_training() && options.track_running_stats()) {
    num_batches_tracked += 1;
    factor = options.momentum().has_value()
                 ? *options.momentum()
                 : 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  }
  return at::batch_norm(input, weight, bias, running_mean, running_var,
                        is_training() || !options.track_running_stats(), factor, options.eps(),
                        at::globalContext().userEnabledCuDNN());
}

at::Tensor SyncBatchNorm2dImpl::forward_over_step(const at::Tensor& input) {
  const ForwardPass& pass = current_forward_pass();
  const int64_t channels = input.size(1);
  const std::vector<int64_t> shape{1, channels, 1, 1};
  const double count = static_cast<double>(input.numel() / std::max<int64_t>(channels, 1));
  // Sums of this forward's batch, centred on its own mean first so that the float64 sum of
  // squares keeps the float32 precision of the variance.
  auto local_sums = [&](const at::Tensor& x) {
    at::Tensor mean = x.mean({0, 2, 3}).to(at::kDouble);
    at::Tensor m2 =
        (x - mean.to(x.scalar_type()).view(shape)).square().sum({0, 2, 3}).to(at::kDouble);
    return at::stack({at::full_like(mean, count), mean * count, m2 + mean.square() * count});
  };
  const at::Tensor x = input.scalar_type() == at::kDouble ? input : input.to(at::kFloat);
  if (!sum_) {
    // One replica: normalising is batch norm's own; only the running statistics are the step's.
    if (!pass.recompute && running_mean.defined()) {
      at::NoGradGuard no_grad;
      update_running_statistics(local_sums(x), pass.step);
    }
    return at::batch_norm(input, weight, bias, at::Tensor(), at::Tensor(), /*training=*/true,
                          /*momentum=*/0.0, options.eps(), at::globalContext().userEnabledCuDNN());
  }
  at::Tensor sums = SumOverReplicasFunction::apply(local_sums(x), sum_);
  if (sums[0][0].item<double>() <= 1) {
    throw std::invalid_argument(fmt::format(
        "batch norm of {} channels: a step's replicas together need more than one value per "
        "channel to train",
        channels));
  }
  if (!pass.recompute && running_mean.defined()) {
    at::NoGradGuard no_grad;
    update_running_statistics(sums.detach(), pass.step);
  }
  at::Tensor mean = sums[1] / sums[0];
  at::Tensor var = (sums[2] / sums[0] - mean.square()).clamp_min(0);
  at::Tensor scale = (var + options.eps()).rsqrt();
  at::Tensor y = (x - mean.to(x.scalar_type()).view(shape)) * scale.to(x.scalar_type()).view(shape);
  if (weight.defined()) y = y * weight.view(shape) + bias.view(shape);
  return y.to(input.scalar_type());
}

void SyncBatchNorm2dImpl::update_running_statistics(const at::Tensor& sums, std::int64_t step) {
  if (step == 0 || step != step_) {
    step_ = step;
    step_sums_ = sums.clone();
    mean_before_ = running_mean.clone();
    var_before_ = running_var.clone();
    num_batches_tracked += 1;
  } else {
    step_sums_ += sums;
  }
  const at::Tensor n = step_sums_[0];
  const at::Tensor mean = step_sums_[1] / n;
  const at::Tensor unbiased =
      (step_sums_[2] - n * mean.square()).clamp_min(0) / (n - 1).clamp_min(1);
  const double factor = options.momentum().has_value()
                            ? *options.momentum()
                            : 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  running_mean.copy_(mean_before_ * (1 - factor) + mean.to(running_mean.scalar_type()) * factor);
  running_var.copy_(var_before_ * (1 - factor) + unbiased.to(running_var.scalar_type()) * factor);
}

}  // namespace ferry::models
