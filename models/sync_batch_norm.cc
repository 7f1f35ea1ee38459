#include "ferry/models/sync_batch_norm.h"

#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>
#include <torch/torch.h>

#include <stdexcept>
#include <utility>

namespace ferry::models {
namespace {

const std::vector<int64_t> kReduced{0, 2, 3};  // every dimension but the channels'

at::Tensor per_channel(const at::Tensor& t) { return t.view({1, -1, 1, 1}); }

at::Tensor summed(const remote_module::SumOverReplicas& sum, const at::Tensor& t) {
  std::vector<at::Tensor> tensors{t.contiguous()};
  sum(tensors);
  return tensors[0].view(t.sizes());
}

// The statistics of one forward's batch: count, mean and sum of squared deviations per channel,
// in float64. Two passes (the mean, then the deviations from it), as batch norm's own: a sum of
// squares less the squared mean would lose the variance of a channel whose mean is large.
BatchStatistics statistics_of(const at::Tensor& x, const remote_module::SumOverReplicas& sum) {
  BatchStatistics s;
  const double local = static_cast<double>(x.numel() / x.size(1));
  at::Tensor count_and_sum = at::cat({at::full({1}, local, x.options().dtype(at::kDouble)),
                                      at::sum(x, kReduced, /*keepdim=*/false, at::kDouble)});
  if (sum) count_and_sum = summed(sum, count_and_sum);
  s.count = count_and_sum[0].item<double>();
  s.mean = count_and_sum.narrow(0, 1, x.size(1)) / s.count;
  const at::Tensor centre = s.mean.to(x.scalar_type());
  s.m2 = at::sum((x - per_channel(centre)).square(), kReduced, /*keepdim=*/false, at::kDouble);
  if (sum) s.m2 = summed(sum, s.m2);
  // The deviations were from the mean rounded to the input's precision.
  s.m2 = (s.m2 - s.count * (s.mean - centre.to(at::kDouble)).square()).clamp_min(0);
  return s;
}

struct SumHolder : torch::CustomClassHolder {
  explicit SumHolder(remote_module::SumOverReplicas s) : sum(std::move(s)) {}
  remote_module::SumOverReplicas sum;
};

// Normalising by statistics taken over every replica. Its backward is batch norm's own, with the
// gradient's two sums per channel taken over every replica too, so that each replica's input
// gets its share of the gradient of the whole step's loss: (dy - mean(dy) - x_hat *
// mean(dy * x_hat)) * weight / std, the means over the whole step. The weight's and bias's
// gradients are this replica's part; the optimizer sums the parts over the replicas.
struct SyncNormalise : torch::autograd::Function<SyncNormalise> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& mean, const at::Tensor& invstd, double count,
                            const remote_module::SumOverReplicas& sum) {
    ctx->save_for_backward({x, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["sum"] = c10::IValue::make_capsule(c10::make_intrusive<SumHolder>(sum));
    at::Tensor y = (x - per_channel(mean)) * per_channel(invstd);
    if (weight.defined()) y = y * per_channel(weight) + per_channel(bias);
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& invstd = saved[3];
    const double count = ctx->saved_data["count"].toDouble();
    const auto holder =
        c10::static_intrusive_pointer_cast<SumHolder>(ctx->saved_data["sum"].toCapsule());
    const at::Tensor dy = grads[0].contiguous();
    const at::Tensor x_hat = (x - per_channel(saved[2])) * per_channel(invstd);
    const at::Tensor local = at::stack({at::sum(dy, kReduced, false, at::kDouble),
                                        at::sum(dy * x_hat, kReduced, false, at::kDouble)});
    const at::Tensor all = summed(holder->sum, local);
    const at::Tensor mean_dy = (all[0] / count).to(x.scalar_type());
    const at::Tensor mean_dy_x_hat = (all[1] / count).to(x.scalar_type());
    at::Tensor scale = weight.defined() ? invstd * weight : invstd;
    at::Tensor dx =
        (dy - per_channel(mean_dy) - x_hat * per_channel(mean_dy_x_hat)) * per_channel(scale);
    at::Tensor dweight, dbias;
    if (weight.defined()) {
      dweight = local[1].to(weight.scalar_type());
      dbias = local[0].to(weight.scalar_type());
    }
    return {dx, dweight, dbias, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
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

void SyncBatchNorm2dImpl::take_step_statistics(remote_module::SumOverReplicas sum) {
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
  const remote_module::ForwardPass& pass = remote_module::current_forward_pass();
  // Under autocast a reduced-precision input is normalised in float32, as batch norm is.
  const at::Tensor x = input.scalar_type() == at::kDouble ? input : input.to(at::kFloat);
  BatchStatistics stats;
  {
    at::NoGradGuard no_grad;
    stats = statistics_of(x.detach(), sum_);
  }
  if (stats.count <= 1) {
    throw std::invalid_argument(
        fmt::format("batch norm of {} channels: {} more than one value per channel to train",
                    input.size(1), sum_ ? "the replicas' batches together need" : "a batch needs"));
  }
  if (!pass.recompute && running_mean.defined()) {
    at::NoGradGuard no_grad;
    update_running_statistics(stats, pass.step);
  }
  if (!sum_) {
    // One replica: normalising is batch norm's own; only the running statistics are the step's.
    return at::batch_norm(input, weight, bias, at::Tensor(), at::Tensor(), /*training=*/true,
                          /*momentum=*/0.0, options.eps(), at::globalContext().userEnabledCuDNN());
  }
  const at::Tensor invstd = (stats.m2 / stats.count + options.eps()).rsqrt();
  at::Tensor y = SyncNormalise::apply(x, weight, bias, stats.mean.to(x.scalar_type()),
                                      invstd.to(x.scalar_type()), stats.count, sum_);
  return y.to(input.scalar_type());
}

void SyncBatchNorm2dImpl::update_running_statistics(const BatchStatistics& batch,
                                                    std::int64_t step) {
  if (step == 0 || step != step_) {
    step_ = step;
    step_stats_ = BatchStatistics{batch.count, batch.mean.clone(), batch.m2.clone()};
    mean_before_ = running_mean.clone();
    var_before_ = running_var.clone();
    num_batches_tracked += 1;
  } else {
    // Chan et al.'s pairwise update: the step so far and this batch as one.
    BatchStatistics& s = step_stats_;
    const double n = s.count + batch.count;
    const at::Tensor delta = batch.mean - s.mean;
    s.mean = s.mean + delta * (batch.count / n);
    s.m2 = s.m2 + batch.m2 + delta.square() * (s.count * batch.count / n);
    s.count = n;
  }
  const BatchStatistics& s = step_stats_;
  const at::Tensor unbiased = s.m2 / std::max(s.count - 1, 1.0);
  const double factor = options.momentum().has_value()
                            ? *options.momentum()
                            : 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  running_mean.copy_(mean_before_ * (1 - factor) + s.mean.to(running_mean.scalar_type()) * factor);
  running_var.copy_(var_before_ * (1 - factor) + unbiased.to(running_var.scalar_type()) * factor);
}

}  // namespace ferry::models
