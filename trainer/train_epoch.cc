#include "trainer/train_epoch.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "ferry/dist_autograd/context.h"
#include "ferry/remote_module/loss.h"
#include "ferry/rpc/rpc.h"
#include "trainer/train_report.h"
#include "trainer/train_setup.h"

namespace ferry::trainer {
namespace {

using Clock = std::chrono::steady_clock;

// Bytes every process of the job has sent so far: this one and each worker holding a stage.
std::uint64_t bytes_sent_by_job(const StagesOnWorkers& job) {
  std::uint64_t total = rpc::agent().bytes_sent();
  std::set<std::string> counted{rpc::self().name};
  for (const Replica& replica : job.replicas) {
    for (const models::RemoteUnet::Stage& stage : replica.split.stages()) {
      if (!counted.insert(stage.module.worker()).second) continue;
      total += static_cast<std::uint64_t>(stage.module.stats().worker_bytes_sent);
    }
  }
  return total;
}

}  // namespace

EpochPass::EpochPass(data::BatchLoader& loader, int epoch, const TrainSettings& s,
                     const StagesOnWorkers& job, std::size_t first_batch, double loss_sum,
                     StepDone step_done)
    : loader_(loader),
      s_(s),
      loss_name_(loss_spec(s)),
      bar_(fmt::format("epoch {}/{}", epoch, s.epochs), loader.batches()),
      first_(first_batch),
      index_(first_batch),
      loss_sum_(loss_sum),
      step_done_(std::move(step_done)) {
  loader_.start_epoch(epoch, first_batch);
  waited_before_ = loader_.waited_s();
  bytes_before_ = bytes_sent_by_job(job);
}

bool EpochPass::train_until(std::size_t batches, StagesOnWorkers& job,
                            const dist_autograd::LrSchedule& schedule, std::int64_t& step) {
  // Each batch's loss is a mean over its images; 1/K of it, summed over K batches, is the mean
  // over the K batches, as one step on a K times larger batch.
  const double scale = 1.0 / s_.accumulate;
  const remote_module::LossFunction loss_fn = remote_module::loss_function(loss_name_);
  auto micro_loss = [&loss_fn, scale](const at::Tensor& out, const at::Tensor& target) {
    return loss_fn(out, target) * scale;
  };
  const std::size_t count = job.replicas.size();
  while (index_ < batches || !ended_step_) {
    std::optional<data::Batch> batch = loader_.next();
    if (!batch) return false;
    auto start = Clock::now();
    ++index_;
    ended_step_ = index_ % s_.accumulate == 0 || index_ == loader_.batches();
    // Each replica's share of the batch in an autograd context of its own (released once the
    // optimizer has stepped with them all).
    std::vector<std::unique_ptr<dist_autograd::Context>> contexts(count);
    std::vector<std::int64_t> ids(count);
    std::vector<double> losses(count);
    for_each_replica(count, [&](std::size_t r) {
      contexts[r] = std::make_unique<dist_autograd::Context>();
      ids[r] = contexts[r]->id();
      Replica& replica = job.replicas[r];
      at::Tensor images = share_of(batch->images, r, count);
      at::Tensor masks = share_of(batch->masks, r, count);
      if (replica.pipe && !replica.pipe->options().loss.empty()) {
        losses[r] = replica.pipe->step(images, masks, scale).loss;
        return;
      }
      if (replica.pipe) {
        losses[r] = replica.pipe->step(images, masks, micro_loss).loss / scale;
        return;
      }
      at::Tensor loss = loss_on_last_stage(s_, /*pipelined=*/false)
                            ? replica.split.loss(images, masks, loss_name_)
                            : loss_fn(replica.split.forward(images, !s_.via_master), masks);
      dist_autograd::backward(ids[r], {loss * scale});
      losses[r] = loss.item<double>();
    });
    auto optimizer_start = Clock::now();
    double loss_value = 0;
    for (double l : losses) loss_value += l / count;
    step_loss_ += loss_value;
    if (ended_step_) {
      const double lr = schedule.lr_at(step);
      if (lr != job.optimizer->spec().options.at("lr")) job.optimizer->set_lr(lr);
      job.optimizer->step(ids);
      ++step;
    } else {
      job.optimizer->accumulate(ids);
    }
    times_.optimizer_s += std::chrono::duration<double>(Clock::now() - optimizer_start).count();
    contexts.clear();
    loss_sum_ += loss_value;
    // What the step's end holds up (a checkpoint's copy) counts in the step's time.
    if (ended_step_) {
      const std::size_t in_step = (index_ - 1) % s_.accumulate + 1;
      if (step_done_) step_done_(StepEnd{step, index_, step_loss_ / in_step, loss_sum_});
      step_loss_ = 0;
    }
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    times_.train_s += seconds;
    times_.images += batch->images.size(0);
    double images_per_s = batch->images.size(0) / seconds;
    rate_ = index_ == first_ + 1 ? images_per_s : 0.9 * rate_ + 0.1 * images_per_s;
    bar_.update(index_, fmt::format("loss {:.4f} {:.1f} img/s", loss_sum_ / index_, rate_));
  }
  return index_ < loader_.batches();
}

EpochTimes EpochPass::times() const {
  EpochTimes out = times_;
  out.train_loss = loss_sum_ / std::max<std::size_t>(index_, 1);
  out.batches = index_ - first_;
  out.data_wait_s = loader_.waited_s() - waited_before_;
  return out;
}

std::uint64_t EpochPass::bytes_sent(const StagesOnWorkers& job) const {
  return bytes_sent_by_job(job) - bytes_before_;
}

}  // namespace ferry::trainer
