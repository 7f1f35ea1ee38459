// One replica's share of data parallelism on a worker: the gradients of its parameters summed
// straight into buckets of about `bucket_bytes`, each all-reduced with the other replicas' as soon
// as all of its gradients of the step are in, while the backward goes on, as DDP does. The
// parameters' `.grad` are views into the buckets: no flat copy of the gradients is made, and a
// bucket holds memory only from its first gradient of a step to the optimizer's step.
//
// Buckets hold the parameters in the reverse order of the forward, the order in which a backward
// produces their gradients, and start strictly in that order on every replica (Gloo runs a
// group's collectives in the order they are started). When a bucket is complete is learnt: the
// first step counts the gradients each parameter receives (one per part of the backward that
// reaches it: per micro-batch, per portal); later steps start a bucket once its parameters have
// that many. A step with fewer (a short last batch) starts the rest when the optimizer steps; a
// gradient that arrives after its bucket started (a step with more) is kept apart, and the
// replicas then all-reduce those in one more round, which every member agrees on by a one-number
// all-reduce at each step. Gradient accumulation sums several contexts' gradients into the
// buckets, which start only in the step's last context, as DDP's no_sync.
//
// Thread rules: add() comes from whichever thread runs the backward; the other calls from the
// owner's. One mutex guards everything; the all-reduces run on the group's own thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "dist_autograd/gradient_sink.h"
#include "ferry/rpc/collective_group.h"

namespace ferry::dist_autograd {

class GradientBuckets : public GradientSink {
 public:
  // Buckets for `params` (those that train) over `group`; not attached until attach().
  GradientBuckets(std::vector<at::Tensor> params, std::unique_ptr<rpc::CollectiveGroup> group,
                  std::int64_t bucket_bytes);
  ~GradientBuckets() override;
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // Makes the parameters' gradients come here (gradient_sink.h).
  static void attach(const std::shared_ptr<GradientBuckets>& buckets);

  void add(std::int64_t context_id, const at::Tensor& variable, const at::Tensor& grad) override;
  at::Tensor gradient(const at::Tensor& variable) const override;

  // Whether `param` is one of the parameters whose gradients the buckets hold.
  bool holds(const at::Tensor& param) const;
  // Keeps context `context_id`'s gradients for the next step (gradient accumulation).
  void keep(std::int64_t context_id);
  // Starts the buckets not yet started, waits for all, and gives every parameter the replicas'
  // average as its `.grad` (a view into its bucket; zeros where no replica had one). Throws
  // rpc::Error naming the group when a member is gone.
  void average_into_grads();
  // Forgets the step's sums; the next add() starts a new step.
  void clear_step();

  struct Stats {
    std::size_t buckets = 0;
    std::int64_t bytes = 0;
    std::int64_t started_in_backward = 0;  // over all steps
    std::int64_t started_at_step = 0;
    std::int64_t late_rounds = 0;
    double waited_s = 0;  // in average_into_grads: the all-reduces the backward did not hide
  };
  Stats stats() const;

 private:
  struct Param {
    at::Tensor variable;
    at::Tensor view;  // the gradient, in its bucket
    at::Tensor late;  // gradients that came after the bucket started
    std::size_t bucket = 0;
    std::int64_t offset = 0;  // of `view` in its bucket
    int seen = 0, expected = 0;
    bool has_value = false;
  };
  struct Bucket {
    at::Tensor flat;  // while a step's gradients are in it
    std::int64_t numel = 0;
    std::vector<std::size_t> params;
    int waiting = 0;  // parameters still short of their expected gradients
    std::optional<rpc::PendingSum> pending;
  };

  std::size_t index_of(const at::Tensor& variable) const;
  void lay_out(std::int64_t bucket_bytes);
  void note_context(std::int64_t context_id);
  void forget_sums();
  void start_ready_buckets();
  void allocate(Bucket& bucket);
  void start(Bucket& bucket);
  void add_late_round();
  void check_usable() const;

  mutable std::mutex mutex_;
  std::unique_ptr<rpc::CollectiveGroup> group_;
  std::vector<Param> params_;
  std::unordered_map<const void*, std::size_t> index_;
  std::vector<Bucket> buckets_;
  std::size_t next_ = 0;  // the next bucket to start
  bool learnt_ = false;   // whether `expected` holds a step's counts
  int late_ = 0;
  std::set<std::int64_t> contexts_, kept_;
  std::string broken_;  // why the group can no longer be used, once it cannot
  Stats stats_;
};

}  // namespace ferry::dist_autograd
