// A handle to a stage living on a worker (mirrors torch.distributed.nn.RemoteModule). Value type:
// copies share the same remote stage, which its worker frees once no handle (and no RRef to it or
// to its parameters) is left. Any thread except an agent's loop thread may use it; calls on one
// stage run one at a time on its worker.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

#include "ferry/remote_module/portal.h"
#include "ferry/remote_module/precision.h"
#include "ferry/remote_module/stage.h"
#include "ferry/rpc/rref.h"

namespace ferry::remote_module {

// What a stage's worker knows of it. Value type.
struct StageStats {
  int64_t parameters = 0;
  int64_t parameter_bytes = 0;
  int64_t buffers = 0;
  double forward_s = 0;  // time spent in its forward on the worker, all calls
  int64_t forward_calls = 0;
  double worker_peak_rss_mib = 0;  // of the whole worker process
  // The most tensor memory its worker process held at once (core::tensor_memory()), all stages.
  double worker_peak_tensor_mib = 0;
  int64_t worker_bytes_sent = 0;  // by its worker's agent so far (rpc::Agent::bytes_sent)
  std::string device;             // where it computes: "cpu", "cuda:0"
  // Its worker's time copying stages' tensors between host and GPU so far, forward and backward.
  double worker_device_copy_s = 0;
};

class RemoteModule {
 public:
  // Builds a registered stage type on `worker`. Throws rpc::Error naming the stage and worker
  // if the type is unknown (with the registered ones) or the config is wrong.
  static RemoteModule create(const std::string& worker, const std::string& type,
                             StageConfig config = stage_config());

  // Loads a TorchScript file (a path on that worker) as a stage; it trains like any other.
  static RemoteModule from_torchscript(const std::string& worker, const std::string& path);

  // Errors carry the stage's own message, the stage type and the worker.
  c10::IValue forward(std::vector<c10::IValue> inputs) const;
  rpc::FuturePtr forward_async(std::vector<c10::IValue> inputs) const;

  // Runs `stages` one after the other, each on its own worker, on `inputs`: each worker sends its
  // stage's output straight to the next stage's worker, so only `inputs` leave this process and
  // only the last output comes back (the naive split through this process moves every
  // activation twice). Distributed autograd follows the same path backwards. Errors name the
  // stage and worker that failed.
  static c10::IValue forward_chain(const std::vector<RemoteModule>& stages,
                                   std::vector<c10::IValue> inputs);
  // The same, each element of a stage's output list going where `routes` says (portal.h): the
  // elements a stage skips go straight from their producer's worker to their consumer's, and
  // their gradients straight back. Empty routes: as above. Throws rpc::Error(InvalidArgument)
  // for routes that do not fit the chain before anything is sent.
  static c10::IValue forward_chain(const std::vector<RemoteModule>& stages,
                                   std::vector<c10::IValue> inputs, const Routes& routes);
  // The same chain with the loss computed where the last stage's output is: `target` travels with
  // the chain, the last stage's worker applies the loss registered there as `loss` (loss.h), and
  // only the scalar loss comes back, on the step's distributed autograd graph (backward from it
  // starts on that worker). Errors as forward_chain's, and one naming the loss and the worker
  // where it is unknown or fails.
  static at::Tensor loss_chain(const std::vector<RemoteModule>& stages,
                               std::vector<c10::IValue> inputs, const Routes& routes,
                               const std::string& loss, const at::Tensor& target);

  void train(bool on = true) const;
  void eval() const { train(false); }
  // RRefs to each parameter, owned by the stage's worker (for a distributed optimizer).
  std::vector<rpc::RRefPtr> remote_parameters() const;
  int64_t parameter_count() const;
  StageStats stats() const;
  // Each of the stage's blocks' compute so far (Stage::block_seconds); empty when it does not
  // time them.
  std::vector<BlockSeconds> block_seconds() const;
  int64_t parameter_bytes() const;
  // Parameters and buffers by name, copied here.
  c10::Dict<std::string, at::Tensor> state_dict() const;
  // Copies tensors into the stage by name; with `strict`, missing or unexpected names are an
  // error. A shape mismatch always is. Each error lists the names concerned.
  void load_state_dict(const c10::Dict<std::string, at::Tensor>& state, bool strict = true) const;
  void to(const std::string& device) const;
  // The precision its forward computes in from now on (precision.h).
  void set_precision(Precision precision) const;
  // Makes the batch statistics of every copy of one stage in `replicas` (one per data-parallel
  // replica, each on its own worker) cover the whole step from now on: summed over the copies
  // in a collective group named `key`, unique in the world, and over a pipelined step's
  // micro-batches (step_statistics.h). Returns how many layers of the stage take them.
  static int64_t take_step_statistics(const std::vector<RemoteModule>& replicas,
                                      const std::string& key);

  const std::string& worker() const { return worker_; }
  const std::string& type() const { return type_; }
  const rpc::RRefPtr& module_rref() const { return module_; }

 private:
  // forward_chain's request, ending with (loss name, targets) for loss_chain.
  static c10::IValue chain(const std::vector<RemoteModule>& stages, std::vector<c10::IValue> inputs,
                           const Routes& routes, std::vector<c10::IValue> loss);
  RemoteModule(std::string worker, std::string type, rpc::RRefPtr module)
      : worker_(std::move(worker)), type_(std::move(type)), module_(std::move(module)) {}
  // Waits until the worker has built `module`; its failure becomes an error naming both.
  static RemoteModule made(const std::string& worker, const std::string& type, rpc::RRefPtr module);
  c10::IValue call(const std::string& what, const std::string& function,
                   std::vector<c10::IValue> args) const;

  std::string worker_;
  std::string type_;
  rpc::RRefPtr module_;
};

}  // namespace ferry::remote_module
