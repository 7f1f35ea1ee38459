#include "dist_autograd/gradient_buckets.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "ferry/rpc/error.h"

namespace ferry::dist_autograd {

GradientBuckets::GradientBuckets(std::vector<at::Tensor> params,
                                 std::unique_ptr<rpc::CollectiveGroup> group,
                                 std::int64_t bucket_bytes)
    : group_(std::move(group)) {
  // A backward produces the last layers' gradients first.
  std::reverse(params.begin(), params.end());
  for (at::Tensor& p : params) {
    index_.emplace(p.unsafeGetTensorImpl(), params_.size());
    params_.push_back(Param{std::move(p), {}, {}, 0, 0, 0, 0, false});
  }
  lay_out(std::max<std::int64_t>(bucket_bytes, 1));
  stats_.buckets = buckets_.size();
}

GradientBuckets::~GradientBuckets() { detach_gradient_sink(this); }

// Consecutive parameters of one type and device share a bucket up to `bucket_bytes`; a larger
// parameter has one of its own.
void GradientBuckets::lay_out(std::int64_t bucket_bytes) {
  std::vector<std::int64_t> sizes;
  std::int64_t bytes = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& v = params_[i].variable;
    const std::int64_t own = v.numel() * static_cast<std::int64_t>(v.element_size());
    bool fresh = buckets_.empty();
    if (!fresh) {
      const at::Tensor& first = params_[buckets_.back().params.front()].variable;
      fresh = first.scalar_type() != v.scalar_type() || first.device() != v.device() ||
              bytes + own > bucket_bytes;
    }
    if (fresh) {
      buckets_.emplace_back();
      sizes.push_back(0);
      bytes = 0;
    }
    params_[i].bucket = buckets_.size() - 1;
    params_[i].offset = sizes.back();
    buckets_.back().params.push_back(i);
    sizes.back() += v.numel();
    bytes += own;
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const at::Tensor& first = params_[buckets_[b].params.front()].variable;
    buckets_[b].numel = sizes[b];
    stats_.bytes += sizes[b] * static_cast<std::int64_t>(first.element_size());
  }
}

// A bucket's memory is taken when its first gradient of a step arrives and given back after the
// step, as a context's own gradients would be: between steps, and in the forward, which is where
// a stage's activations peak, the buckets take nothing.
void GradientBuckets::allocate(Bucket& bucket) {
  if (bucket.flat.defined()) return;
  const at::Tensor& first = params_[bucket.params.front()].variable;
  bucket.flat = at::empty({bucket.numel}, first.options().requires_grad(false));
  for (std::size_t i : bucket.params) {
    Param& p = params_[i];
    p.view = bucket.flat.narrow(0, p.offset, p.variable.numel()).view(p.variable.sizes());
  }
}

void GradientBuckets::attach(const std::shared_ptr<GradientBuckets>& buckets) {
  std::vector<at::Tensor> variables;
  for (const Param& p : buckets->params_) variables.push_back(p.variable);
  attach_gradient_sink(variables, buckets);
}

std::size_t GradientBuckets::index_of(const at::Tensor& variable) const {
  auto it = index_.find(variable.unsafeGetTensorImpl());
  if (it == index_.end()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("{}: a gradient arrived for a tensor of shape {} that is not "
                                 "among the replicated parameters",
                                 group_->describe(), c10::str(variable.sizes())));
  }
  return it->second;
}

bool GradientBuckets::holds(const at::Tensor& param) const {
  return index_.count(param.unsafeGetTensorImpl()) > 0;
}

void GradientBuckets::check_usable() const {
  if (broken_.empty()) return;
  throw rpc::Error(
      rpc::ErrorKind::RemoteException,
      fmt::format("{} can no longer average gradients: {}", group_->describe(), broken_));
}

// A context that contributed, was neither kept nor stepped, and is followed by another was
// abandoned (its step failed): its sums go, unless an all-reduce already took them.
void GradientBuckets::note_context(std::int64_t context_id) {
  if (!contexts_.insert(context_id).second) return;
  const bool abandoned = std::any_of(contexts_.begin(), contexts_.end(), [&](std::int64_t c) {
    return c != context_id && !kept_.count(c);
  });
  if (!abandoned) return;
  if (next_ > 0) {
    broken_ = fmt::format(
        "the gradients of a step that never stepped were already being all-reduced when autograd "
        "context {} began",
        context_id);
    check_usable();
  }
  forget_sums();
  contexts_ = {context_id};
}

// No gradient of a step taken yet: each bucket waits for its parameters that expect any.
void GradientBuckets::forget_sums() {
  for (Param& p : params_) {
    p.has_value = false;
    p.seen = 0;
    p.late = at::Tensor();
  }
  for (Bucket& bucket : buckets_) {
    bucket.waiting = 0;
    for (std::size_t i : bucket.params) bucket.waiting += params_[i].expected > 0 ? 1 : 0;
  }
  late_ = 0;
  contexts_.clear();
  kept_.clear();
}

void GradientBuckets::add(std::int64_t context_id, const at::Tensor& variable,
                          const at::Tensor& grad) {
  std::lock_guard<std::mutex> lock(mutex_);
  check_usable();
  note_context(context_id);
  Param& p = params_[index_of(variable)];
  Bucket& bucket = buckets_[p.bucket];
  if (bucket.pending) {
    p.late = p.late.defined() ? p.late + grad : grad.clone();
    ++late_;
    ++p.seen;  // so that the next steps expect it
    return;
  }
  if (p.has_value) {
    p.view.add_(grad);
  } else {
    allocate(bucket);
    p.view.copy_(grad);
    p.has_value = true;
  }
  if (++p.seen == p.expected) --bucket.waiting;
  if (learnt_) start_ready_buckets();
}

at::Tensor GradientBuckets::gradient(const at::Tensor& variable) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Param& p = params_[index_of(variable)];
  return p.has_value ? p.view : at::Tensor();
}

void GradientBuckets::keep(std::int64_t context_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  contexts_.insert(context_id);
  kept_.insert(context_id);
}

void GradientBuckets::start(Bucket& bucket) {
  allocate(bucket);
  for (std::size_t i : bucket.params) {
    if (!params_[i].has_value) params_[i].view.zero_();
  }
  bucket.pending = group_->start_sum(bucket.flat);
  ++next_;
}

void GradientBuckets::start_ready_buckets() {
  while (next_ < buckets_.size() && buckets_[next_].waiting <= 0) {
    start(buckets_[next_]);
    ++stats_.started_in_backward;
  }
}

// Every member says how many gradients came late; if any did, all sum theirs, bucket by bucket.
void GradientBuckets::add_late_round() {
  at::Tensor count = at::full({1}, static_cast<float>(late_), at::kFloat);
  group_->start_sum(count).wait();
  if (count.item<float>() == 0) return;
  ++stats_.late_rounds;
  for (Bucket& bucket : buckets_) {
    at::Tensor late = at::zeros_like(bucket.flat);
    for (std::size_t i : bucket.params) {
      const Param& p = params_[i];
      if (p.late.defined()) late.narrow(0, p.offset, p.variable.numel()).copy_(p.late.reshape(-1));
    }
    group_->start_sum(late).wait();
    bucket.flat.add_(late);
  }
}

void GradientBuckets::average_into_grads() {
  std::lock_guard<std::mutex> lock(mutex_);
  check_usable();
  const auto begin = std::chrono::steady_clock::now();
  try {
    while (next_ < buckets_.size()) {
      start(buckets_[next_]);
      ++stats_.started_at_step;
    }
    for (Bucket& bucket : buckets_) bucket.pending->wait();
    add_late_round();
  } catch (const std::exception& e) {
    broken_ = e.what();
    throw;
  }
  stats_.waited_s +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  for (Bucket& bucket : buckets_) bucket.flat.div_(group_->size());
  for (Param& p : params_) {
    p.variable.mutable_grad() = p.view;
    p.expected = std::max(p.expected, p.seen);
  }
  learnt_ = true;
}

void GradientBuckets::clear_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  forget_sums();
  next_ = 0;
  // Only a broken group leaves an all-reduce unwaited; its buffer is not reused then.
  if (!broken_.empty()) return;
  for (Bucket& bucket : buckets_) {
    bucket.pending.reset();
    bucket.flat = at::Tensor();
    for (std::size_t i : bucket.params) params_[i].view = at::Tensor();
  }
}

GradientBuckets::Stats GradientBuckets::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace ferry::dist_autograd
