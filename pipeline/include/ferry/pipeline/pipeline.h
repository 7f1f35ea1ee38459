// Pipeline parallelism over remote stages. A batch is cut into M micro-batches along its first
// dimension; each stage's worker runs them one at a time and sends each output straight to the
// next stage's worker, so while one stage works on micro-batch m the one before it works on
// m + 1. Two schedules:
//   - GPipe: every micro-batch's forward, then every backward. Each stage keeps the activations
//     of all M micro-batches until their backward.
//   - 1F1B: after a warm-up, each stage alternates one forward and one backward, so stage s keeps
//     at most p - s micro-batches' activations (p stages): the same bubble, less memory.
//   - Zero-bubble ("zb"): 1F1B's order, with each backward split in two. Its input pass computes
//     only the gradients the stage before waits for and sends them at once; its weight pass (the
//     parameters' gradients) is deferred and runs whenever the stage has nothing else to do, so
//     it fills what would be the bubble. Stage s keeps at most p - s micro-batches, as under
//     1F1B, those whose weight pass waits counted (such a micro-batch holds only what its weight
//     pass needs: the inputs of the nodes that compute weights' gradients and the gradients of
//     their outputs). A recomputed stage, or one that uses a parameter twice, runs each backward
//     whole.
// M = 1 is the naive split, in which one stage works at a time.
//
// Gradients: each stage runs its own backward per micro-batch and adds its parameters' gradients
// to the distributed autograd context of the step, so DistributedOptimizer::step(context) updates
// every stage once per batch with the sum. For a loss that is a mean over samples, the sum equals
// the full batch's gradient. Batch norm normalises each micro-batch by its own statistics (as in
// GPipe), so a model with batch norm matches the full batch only approximately.
//
// The loss: either the last stage computes it (PipelineOptions::loss, a loss registered by name on
// its worker; remote_module/loss.h), so that only each micro-batch's loss value comes to the
// master and the last stage starts each backward itself (1F1B: right after the forward; GPipe:
// once every forward is done), or the master computes it from the logits the last stage sends
// and sends their gradient back (a Loss function; one more round trip per micro-batch).
//
// Activation checkpointing: a checkpointed stage keeps only its inputs and computes its forward
// again in backward, under the random-number state of the first run.
//
// Thread rules: a Pipeline is used by one thread at a time, never an agent's loop thread. Every
// process of a world that runs pipelines (master and workers) calls install() before rpc::init().
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/pipeline/schedules.h"
#include "ferry/pipeline/timeline.h"
#include "ferry/remote_module/portal.h"
#include "ferry/remote_module/remote_module.h"
#include "ferry/rpc/registry.h"

namespace ferry::pipeline {

// Adds every function a process of a training world serves to `registry` (normally
// rpc::default_registry()), before rpc::init(): the stages' and portals' (remote_module), the
// distributed autograd's and optimizer's (dist_autograd) and the pipeline's own. The one call a
// master or worker needs; a second call does nothing.
void install(rpc::FunctionRegistry& registry);

struct PipelineOptions {
  Schedule schedule = Schedule::GPipe;
  int microbatches = 1;
  // Stage positions whose activations are recomputed in backward.
  std::vector<int> checkpoint_stages;
  // What the timeline calls each stage ("stage 0: encoder on worker1"); its type where not given.
  std::vector<std::string> stage_names;
  // Where each element of each stage's output list goes (portal.h; RemoteUnet::routes()). Empty:
  // each stage's whole output goes to the next.
  remote_module::Routes routes;
  // The loss the last stage computes, by its registered name; empty: the master computes it
  // (step() with a Loss).
  std::string loss;
};

class Pipeline {
 public:
  // The loss of one micro-batch: a scalar, the mean over its samples.
  using Loss = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

  // `stages` in order; the first takes the input, the last returns one tensor. Throws
  // rpc::Error(InvalidArgument) for no stages, M < 1, a checkpoint position out of range, routes
  // that do not fit the stages or a loss the last stage's worker does not know, and the error of a
  // worker that cannot take part.
  Pipeline(std::vector<remote_module::RemoteModule> stages, PipelineOptions options);
  // Tells the workers to forget this pipeline (bounded; failures are logged).
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  struct StepResult {
    double loss = 0;    // the full batch's: micro-batch losses weighted by their share
    at::Tensor output;  // the last stage's outputs, concatenated in order, without grad
  };
  // Forward and backward of one batch under the schedule, inside the distributed autograd context
  // open on this thread (throws rpc::Error(InvalidArgument) without one). Its gradients are then
  // in that context. A batch smaller than M gets one sample per micro-batch. A failure anywhere
  // is an rpc::Error naming the micro-batch, the stage and its worker; the workers drop what the
  // step left, and the pipeline can step again.
  StepResult step(const at::Tensor& input, const at::Tensor& target, const Loss& loss);
  // The same with the loss on the last stage (PipelineOptions::loss): the targets go to its
  // worker, each micro-batch's loss counts `loss_scale` times in the gradients (1/K when K batches
  // accumulate), and StepResult::loss is the batch's unscaled loss; StepResult::output is empty.
  StepResult step(const at::Tensor& input, const at::Tensor& target, double loss_scale = 1.0);

  // Every step so far, on this process's clock.
  const Timeline& timeline() const { return *timeline_; }

  // Memory of each stage since the last call (or since this pipeline was made), MiB. One call per
  // stage; each starts new peaks.
  struct StageMemory {
    // The most that the micro-batches between their forward and backward held at once: saved
    // tensors of the graph, inputs and outputs (for a checkpointed stage, its inputs).
    double activation_mib = 0;
    // The peak of all tensor memory of the stage's worker less what it held at the last call
    // (see core::tensor_memory(): gradients and transfers too; stages that share a worker share
    // it).
    double tensor_mib = 0;
  };
  std::vector<StageMemory> memory_peaks();

  const PipelineOptions& options() const { return options_; }
  const std::vector<remote_module::RemoteModule>& stages() const { return stages_; }

 private:
  // `loss` null: the last stage computes it.
  StepResult run_step(const at::Tensor& input, const at::Tensor& target, const Loss* loss,
                      double loss_scale);
  // Under the zero-bubble schedule: until every stage's weight passes of the step are done.
  void wait_for_weight_passes();
  // What a failed step left on the workers goes, so that the next step starts clean.
  void discard_step();

  std::vector<remote_module::RemoteModule> stages_;
  PipelineOptions options_;
  std::int64_t id_;
  std::vector<std::int64_t> clock_offsets_ns_;  // each stage worker's steady clock less ours
  std::vector<std::int64_t> memory_base_;       // each stage worker's live bytes at the last call
  std::unique_ptr<Timeline> timeline_;
};

}  // namespace ferry::pipeline
