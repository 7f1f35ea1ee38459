#include "trainer/replicas.h"

#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>

#include "ferry/remote_module/loss.h"
#include "ferry/rpc/error.h"
#include "trainer/class_scores.h"

namespace ferry::trainer {

void for_each_replica(std::size_t count, const std::function<void(std::size_t)>& fn) {
  if (count == 1) {
    fn(0);
    return;
  }
  std::vector<std::exception_ptr> failures(count);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < count; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        failures[r] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // A lost worker's failure first: the caller may put a spare in its place.
  if (std::exception_ptr failure = rpc::first_failure(failures)) std::rethrow_exception(failure);
}

at::Tensor share_of(const at::Tensor& batch, std::size_t r, std::size_t count) {
  const auto n = batch.size(0);
  const auto per = n / static_cast<int64_t>(count);
  const auto extra = n % static_cast<int64_t>(count);
  const auto index = static_cast<int64_t>(r);
  const int64_t begin = index * per + std::min(index, extra);
  return batch.narrow(0, begin, per + (index < extra ? 1 : 0));
}

double Validation::of(Monitor metric) const {
  switch (metric) {
    case Monitor::ValLoss:
      return loss;
    case Monitor::ValIou:
      return iou;
    case Monitor::ValMiou:
      return miou;
    case Monitor::ValDice:
      break;
  }
  return dice;
}

Validation validate(std::vector<Replica>& replicas, data::BatchLoader& loader,
                    const std::string& loss, bool direct, const data::MaskLabels& labels,
                    int64_t piece) {
  for (Replica& replica : replicas) replica.split.train(false);
  loader.start_epoch(0);
  const remote_module::LossFunction loss_fn = remote_module::loss_function(loss);
  struct Sums {
    double loss = 0;
    int64_t images = 0;
    ClassCounts counts;
  };
  std::vector<Sums> sums(replicas.size(), Sums{0, 0, {labels.classes, labels.ignore_index}});
  while (auto batch = loader.next()) {
    for_each_replica(replicas.size(), [&](std::size_t r) {
      at::Tensor images = share_of(batch->images, r, replicas.size());
      if (images.size(0) == 0) return;
      at::Tensor masks = share_of(batch->masks, r, replicas.size());
      torch::NoGradGuard no_grad;  // per thread
      Sums& s = sums[r];
      for (int64_t at = 0; at < images.size(0); at += piece) {
        const int64_t n = std::min(piece, images.size(0) - at);
        at::Tensor logits = replicas[r].split.forward(images.narrow(0, at, n), direct);
        const at::Tensor part = masks.narrow(0, at, n);
        s.loss += loss_fn(logits, part).item<double>() * static_cast<double>(n);
        s.counts.add(logits, part);
      }
      s.images += images.size(0);
    });
  }
  for (Replica& replica : replicas) replica.split.train(true);
  Sums all{0, 0, {labels.classes, labels.ignore_index}};
  for (const Sums& s : sums) {
    all.loss += s.loss;
    all.images += s.images;
    all.counts.add(s.counts);
  }
  const ClassScores scores = all.counts.scores();
  Validation v;
  v.loss = all.images ? all.loss / all.images : 0;
  v.iou = scores.mean_iou;
  v.dice = scores.mean_dice;
  v.miou = scores.miou;
  v.class_iou = scores.iou;
  v.class_dice = scores.dice;
  return v;
}

}  // namespace ferry::trainer
