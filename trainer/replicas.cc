#include "trainer/replicas.h"

#include <torch/torch.h>

#include <exception>
#include <mutex>
#include <thread>

#include "ferry/remote_module/loss.h"
#include "ferry/rpc/error.h"

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

at::Tensor loss_of(const std::string& kind, const at::Tensor& logits, const at::Tensor& masks) {
  return remote_module::loss_function(kind)(logits, masks);
}

double Validation::of(const std::string& metric) const {
  return metric == "val_loss" ? loss : metric == "val_iou" ? iou : dice;
}

Validation validate(std::vector<Replica>& replicas, data::BatchLoader& loader,
                    const std::string& loss, bool direct) {
  for (Replica& replica : replicas) replica.split.train(false);
  loader.start_epoch(0);
  struct Sums {
    double loss = 0, intersection = 0, union_ = 0, predicted = 0, truth = 0;
    int64_t images = 0;
  };
  std::vector<Sums> sums(replicas.size());
  while (auto batch = loader.next()) {
    for_each_replica(replicas.size(), [&](std::size_t r) {
      at::Tensor images = share_of(batch->images, r, replicas.size());
      if (images.size(0) == 0) return;
      at::Tensor masks = share_of(batch->masks, r, replicas.size());
      torch::NoGradGuard no_grad;  // per thread
      at::Tensor logits = replicas[r].split.forward(images, direct);
      Sums& s = sums[r];
      s.loss += loss_of(loss, logits, masks).item<double>() * images.size(0);
      at::Tensor p = (logits > 0).to(torch::kFloat);
      s.intersection += (p * masks).sum().item<double>();
      s.predicted += p.sum().item<double>();
      s.truth += masks.sum().item<double>();
      s.union_ += ((p + masks) > 0).sum().item<double>();
      s.images += images.size(0);
    });
  }
  for (Replica& replica : replicas) replica.split.train(true);
  Sums all;
  for (const Sums& s : sums) {
    all.loss += s.loss;
    all.intersection += s.intersection;
    all.union_ += s.union_;
    all.predicted += s.predicted;
    all.truth += s.truth;
    all.images += s.images;
  }
  Validation v;
  v.loss = all.images ? all.loss / all.images : 0;
  v.iou = all.union_ > 0 ? all.intersection / all.union_ : 1;
  v.dice = all.predicted + all.truth > 0 ? 2 * all.intersection / (all.predicted + all.truth) : 1;
  return v;
}

}  // namespace ferry::trainer
