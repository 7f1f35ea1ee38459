// DistributedOptimizer (mirrors torch.distributed.optim.DistributedOptimizer): one local
// optimizer on each worker that owns some of the parameters, all stepped at once with the
// gradients an autograd context accumulated there. No code travels: a worker builds the
// optimizer from its name and hyper-parameters.
//
// Thread rules: a DistributedOptimizer is used by one thread at a time (any thread but an agent's
// loop thread); steps of two optimizers, or of one from two threads in turn, do not interleave
// on a worker.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ferry/rpc/rref.h"

namespace torch::optim {
class Optimizer;
class OptimizerParamState;
}  // namespace torch::optim

namespace ferry::dist_autograd {

// An optimizer by name and hyper-parameters. Value type. Built in: "sgd" (lr, momentum,
// dampening, weight_decay, nesterov), "adam" and "adamw" (lr, beta1, beta2, eps, weight_decay,
// amsgrad); booleans are 0 or 1.
struct OptimizerSpec {
  std::string name;
  std::map<std::string, double> options;

  static OptimizerSpec sgd(double lr, double momentum = 0, double weight_decay = 0);
  static OptimizerSpec adam(double lr, double weight_decay = 0);
  static OptimizerSpec adamw(double lr, double weight_decay = 1e-2);
};

// How a worker builds an optimizer type: over `params` with `options` (throwing for an option it
// does not take), and an empty per-parameter state for restoring a saved one.
struct OptimizerFactory {
  std::function<std::unique_ptr<torch::optim::Optimizer>(
      std::vector<at::Tensor> params, const std::map<std::string, double>& options)>
      make;
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>()> make_state;
  // A copy of one parameter's state that later steps leave alone (its tensors copied into host
  // memory), so that a take at a step turns it into bytes only when it is fetched. Optional:
  // where it is empty, take_state() serializes each state at once.
  std::function<std::unique_ptr<torch::optim::OptimizerParamState>(
      const torch::optim::OptimizerParamState&)>
      copy_state;
};
// Registers a type under `name` in this process (workers that host the parameters need it).
void register_optimizer(const std::string& name, OptimizerFactory factory);

class DistributedOptimizer {
 public:
  // Builds the local optimizer of every owner of `params` (RRefs to leaf tensors, such as
  // RemoteModule::remote_parameters()). Throws rpc::Error naming the worker that could not.
  DistributedOptimizer(OptimizerSpec spec, std::vector<rpc::RRefPtr> params);
  // Data parallel beside model parallel: replicas[r] holds replica r's parameters, in the same
  // order for every replica, each replica's on workers of its own and placed alike (its i-th
  // owner holds the parameters replica 0's i-th holds). Each set of owners of the same parameters
  // joins a Gloo group (rpc::CollectiveGroup) and averages their gradients before every step, so
  // the replicas stay identical: in buckets of about `bucket_mib` MiB, each all-reduced as soon as
  // the backward has produced its gradients (DDP's buckets). Throws rpc::Error(InvalidArgument)
  // for replicas that differ.
  DistributedOptimizer(OptimizerSpec spec, std::vector<std::vector<rpc::RRefPtr>> replicas,
                       double bucket_mib = kDefaultBucketMib);
  static constexpr double kDefaultBucketMib = 25;

  // Steps every owner's optimizer concurrently with the gradients of `context_id` there; a
  // parameter without a gradient in it is left alone. Throws rpc::Error naming every owner that
  // failed.
  // Gradients summed by earlier accumulate() calls join this context's. With replicas, one
  // context per replica (the one its step ran in); every replica steps at once.
  void step(std::int64_t context_id);
  void step(const std::vector<std::int64_t>& context_ids);
  // Keeps the gradients of `context_id` on every owner, summed, for the next step (gradient
  // accumulation: the context may then be released). Costs one copy of the gradients per owner,
  // as `.grad` would. Throws as step() does.
  void accumulate(std::int64_t context_id);
  void accumulate(const std::vector<std::int64_t>& context_ids);
  // Sets every parameter group's learning rate on every owner (a schedule calls it per step).
  void set_lr(double lr);

  // With replicas, how each owner's gradient buckets have gone over all steps so far.
  struct BucketStats {
    std::string worker;
    int replica = 0;
    std::int64_t buckets = 0, bytes = 0;
    std::int64_t started_in_backward = 0;  // all-reduces that overlapped the backward
    std::int64_t started_at_step = 0;      // ones that waited for the optimizer's step
    std::int64_t late_rounds = 0;          // steps that needed a round for late gradients
    double waited_s = 0;  // the steps' waits for all-reduces the backward did not hide
  };
  std::vector<BucketStats> bucket_stats() const;

  // The optimizer state of each parameter, in the order given to the constructor (a list of byte
  // tensors, empty where a parameter has no state yet). It depends only on that order, not on
  // which worker holds what, so it restores into stages placed anywhere. With replicas: replica
  // 0's, and loading restores every replica.
  c10::IValue state_dict() const;
  // Throws rpc::Error if `state` does not match the parameters.
  void load_state_dict(const c10::IValue& state);
  // state_dict() in two halves: each owner of replica 0 copies its state now and holds it
  // (ready once every copy is made); fetch() has the owners turn their copies into bytes and
  // brings them here as state_dict() would have given them then, from any thread, after this
  // optimizer is gone too.
  struct TakenState {
    std::vector<rpc::RRefPtr> per_owner;
    std::vector<std::vector<std::size_t>> indices;  // each owner's parameters' positions
    std::size_t parameter_count = 0;
    c10::IValue fetch() const;
  };
  TakenState take_state() const;

  // The state handed to another optimizer over the same parameters, worker to worker (a model
  // cut anew while it trains): park() leaves each owner's state on its worker, where it stays
  // after this optimizer is gone, for as long as the returned RRefs live.
  struct Parked {
    int replica = 0;
    rpc::RRefPtr state;
  };
  std::vector<Parked> park() const;
  // Each owner fetches its parameters' state from the parks of its replica that hold it
  // (parameters matched by position, as load_state_dict matches them), straight from their
  // workers. Throws rpc::Error naming an owner that found some parameter in no park.
  void load_parked(const std::vector<Parked>& parked);

  // Calls of step() that went through on every owner.
  std::int64_t steps() const { return steps_; }
  // Whether the owner of `replica` on `worker` stands where every owner stood after the last
  // step: it has taken steps() steps, not one more (a step that failed on another owner may have
  // gone through on this one). False where `worker` holds no owner of `replica` or does not
  // answer. Reads a counter only, without waiting for the owner's running work.
  bool between_steps(int replica, const std::string& worker) const;
  // The state of `replica`'s owner on `worker`, to be parked there as park() parks it, for the
  // owners of replica `for_replica` that hold the same parameters (a lost replica's stage
  // rebuilt from a surviving one's).
  struct OwnerPark {
    int replica = 0;
    std::string worker;
    int for_replica = 0;
  };
  // Parks each of `owners`, all at once. Throws rpc::Error naming a worker that could not.
  std::vector<Parked> park_owners(const std::vector<OwnerPark>& owners) const;

  const OptimizerSpec& spec() const { return spec_; }
  std::size_t parameter_count() const { return parameter_count_; }  // per replica
  int replica_count() const { return replica_count_; }
  // The workers holding a local optimizer (of replica 0).
  std::vector<std::string> owners() const;

 private:
  struct Owner {
    std::string worker;
    int replica = 0;
    rpc::RRefPtr optimizer;            // the local optimizer, held by its worker
    std::vector<std::size_t> indices;  // its parameters' positions in the constructor's list
  };
  // Calls `function` on every owner (of `replica`, or all) at once with (optimizer,
  // extra(owner)...); throws naming each owner that failed `what`. Returns the results in owner
  // order.
  std::vector<c10::IValue> on_owners(
      const std::string& what, const std::string& function,
      const std::function<std::vector<c10::IValue>(const Owner&)>& extra, int replica = -1) const;
  const Owner& owner_on(int replica, const std::string& worker) const;
  // Owners from `first` on (replica `replica`'s) hold what replica 0's do, in the same order.
  void check_lines_up(std::size_t first, int replica) const;
  // `function` on every owner with its replica's context (one per replica, else InvalidArgument).
  void on_contexts(const std::string& what, const std::string& function,
                   const std::vector<std::int64_t>& context_ids) const;

  OptimizerSpec spec_;
  int replica_count_ = 1;
  std::vector<Owner> owners_;  // replica by replica
  std::size_t parameter_count_ = 0;
  std::int64_t steps_ = 0;
};

}  // namespace ferry::dist_autograd
