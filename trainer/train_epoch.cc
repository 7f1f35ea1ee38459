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

EpochTimes train_epoch(std::unique_ptr<StagesOnWorkers>& job_ptr, data::BatchLoader& loader,
                       int epoch, const TrainSettings& s, const dist_autograd::LrSchedule& schedule,
                       std::int64_t& step, const AfterStep& after_step) {
  // Each batch's loss is a mean over its images; 1/K of it, summed over K batches, is the mean
  // over the K batches, as one step on a K times larger batch.
  const double scale = 1.0 / s.accumulate;
  const std::string loss_name = loss_spec(s);
  const remote_module::LossFunction loss_fn = remote_module::loss_function(loss_name);
  auto micro_loss = [&loss_fn, scale](const at::Tensor& out, const at::Tensor& target) {
    return loss_fn(out, target) * scale;
  };
  loader.start_epoch(epoch);
  const double waited_before = loader.waited_s();
  ProgressBar bar(fmt::format("epoch {}/{}", epoch, s.epochs), loader.batches());
  double loss_sum = 0, rate = 0;
  EpochTimes times;
  const std::uint64_t bytes_before = bytes_sent_by_job(*job_ptr);
  std::size_t index = 0;
  const std::size_t count = job_ptr->replicas.size();
  while (auto batch = loader.next()) {
    StagesOnWorkers& job = *job_ptr;
    auto start = Clock::now();
    ++index;
    const bool steps = index % s.accumulate == 0 || index == loader.batches();
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
      at::Tensor loss = loss_on_last_stage(s, /*pipelined=*/false)
                            ? replica.split.loss(images, masks, loss_name)
                            : loss_fn(replica.split.forward(images, !s.via_master), masks);
      dist_autograd::backward(ids[r], {loss * scale});
      losses[r] = loss.item<double>();
    });
    auto optimizer_start = Clock::now();
    if (steps) {
      const double lr = schedule.lr_at(step);
      if (lr != job.optimizer->spec().options.at("lr")) job.optimizer->set_lr(lr);
      job.optimizer->step(ids);
      ++step;
    } else {
      job.optimizer->accumulate(ids);
    }
    times.optimizer_s += std::chrono::duration<double>(Clock::now() - optimizer_start).count();
    contexts.clear();
    double loss_value = 0;
    for (double l : losses) loss_value += l / count;
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    times.train_s += seconds;
    times.images += batch->images.size(0);
    double images_per_s = batch->images.size(0) / seconds;
    rate = index == 1 ? images_per_s : 0.9 * rate + 0.1 * images_per_s;
    loss_sum += loss_value;
    bar.update(index, fmt::format("loss {:.4f} {:.1f} img/s", loss_sum / index, rate));
    if (steps && after_step) after_step(index);
  }
  job_ptr->last_train_loss = loss_sum / std::max<std::size_t>(index, 1);
  times.batches = index;
  times.data_wait_s = loader.waited_s() - waited_before;
  times.bytes_sent = bytes_sent_by_job(*job_ptr) - bytes_before;
  return times;
}
}  // namespace ferry::trainer
