// One step of a pipeline as the master drives it. It sends each micro-batch's input to the first
// stage when the schedule lets it in, takes each output the last stage sends here (the
// "ferry.pipeline.output" call lands in the step's inbox), computes that micro-batch's loss and
// its gradient here, and sends the gradient to the last stage when the schedule says, until every
// backward is done. GPipe sends every input at once and every gradient once all outputs are in;
// 1F1B keeps at most p micro-batches in flight and sends each gradient as soon as it can.
// With the loss on the last stage, the step's targets go to that stage first, and what arrives
// per micro-batch is its loss once its backward is done (the stage started it itself).
//
// Thread rules: a MasterStep is used by the thread that made it, inside the step's distributed
// autograd context; replies reach its inbox from the agent's threads.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/pipeline/pipeline.h"
#include "ferry/pipeline/timeline.h"
#include "pipeline/schedule.h"

namespace ferry::pipeline {

class Inbox;

// Throws rpc::Error(InvalidArgument) for what Pipeline::step cannot start with: no autograd
// context (0), an empty batch, targets that do not match the inputs.
void check_step_arguments(std::int64_t context, const at::Tensor& input, const at::Tensor& target);

class MasterStep {
 public:
  // Where the step goes in and out: the pipeline, its first and last stages' workers, its length.
  struct Ends {
    std::int64_t pipeline = 0;
    std::string first_worker;
    std::string last_worker;
    int stages = 0;
    bool loss_on_stage = false;
  };
  // Splits `input` and `target` into `microbatches` along their first dimension (fewer for a
  // smaller batch: one sample each) and takes the outputs that arrive for `context` from now on.
  // `loss` computes the loss here; null where the last stage does (Ends::loss_on_stage), each
  // micro-batch's counting `loss_scale` times in its gradients. `step` numbers its spans.
  MasterStep(Ends ends, std::int64_t context, const at::Tensor& input, const at::Tensor& target,
             const Pipeline::Loss* loss, double loss_scale, Schedule schedule, int microbatches,
             int step);
  ~MasterStep();
  MasterStep(const MasterStep&) = delete;
  MasterStep& operator=(const MasterStep&) = delete;

  // Runs the step until every backward is done. Throws the first failure a stage reports (its
  // kind and cause kept), InvalidArgument for a loss that fails or is not a scalar computed from
  // the output, and Timeout when nothing arrives for `patience`.
  void run(std::chrono::milliseconds patience);

  // The full batch's loss: each micro-batch's weighted by its share of the samples.
  double loss() const { return loss_; }
  // The last stage's outputs, concatenated in micro-batch order, without grad; empty with the
  // loss on the last stage.
  at::Tensor output() const;
  // The master's own spans (sends and losses), on its steady clock.
  std::vector<Span>& spans() { return spans_; }
  // When each micro-batch's input, and its gradient, left here (steady clock, ns).
  const std::vector<std::int64_t>& input_sent() const { return input_sent_; }
  const std::vector<std::int64_t>& grad_sent() const { return grad_sent_; }

 private:
  void send_forward(int m);
  void send_backward(int m);
  void take_output(int m, at::Tensor out);
  void send_targets();
  void add_span(SpanKind kind, int m, std::int64_t start_ns);

  const Ends ends_;
  const std::int64_t context_;
  const Pipeline::Loss* loss_of_;
  const double loss_scale_;
  const int step_;
  const int count_;  // micro-batches
  const double samples_;
  const std::unique_ptr<MicrobatchSchedule> schedule_;
  std::vector<at::Tensor> inputs_, targets_, outputs_, grads_;
  std::vector<std::int64_t> input_sent_, grad_sent_;
  std::vector<Span> spans_;
  std::shared_ptr<Inbox> inbox_;
  double loss_ = 0;
  int outputs_in_ = 0;
  int backwards_done_ = 0;
};

}  // namespace ferry::pipeline
