// One micro-batch's backward on one stage in two passes, for the zero-bubble schedule. The input
// pass computes what the stage before waits for: the gradients of the stage's inputs (and of the
// portals' anchors). The weight pass runs later, node by node: each node that computes a weight
// matrix's or kernel's gradient (a convolution, a linear layer) computes only that, from the
// gradient that reached it in the input pass and that it kept. No node computes an input gradient
// twice. Parameters that are vectors (a norm's scale and shift) have gradients that are sums over
// what the input pass computes anyway: their nodes compute them in the input pass, and keep
// nothing for later.
//
// The nodes that have no weight pass (a ReLU, an addition, a batch norm) free their saved tensors
// as soon as the input pass has run them, and after it every edge between the nodes it ran is
// cut; each node of the weight pass frees its own when its part is done. What stays between the
// passes is, for each node of the weight pass, its saved tensors (its input) and the gradient of
// its output.
//
// A graph in which one parameter's gradient comes through two of those nodes (a parameter used
// twice) does not split: splits() is false and the caller runs the backward whole.
//
// Thread rules: one thread at a time (the stage's compute thread).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace ferry::pipeline {

class SplitBackward {
 public:
  // `roots` (tensors requiring grad) with their gradients `root_grads`; `inputs` the leaves whose
  // gradients the input pass computes (none on a first stage: everything then waits for the
  // weight pass); `params` the leaves whose gradients the weight pass computes.
  SplitBackward(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& root_grads,
                const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params);
  ~SplitBackward();
  SplitBackward(const SplitBackward&) = delete;
  SplitBackward& operator=(const SplitBackward&) = delete;

  bool splits() const { return splits_; }

  // Gives parameters and their gradients, fresh from a pass: nothing else holds them.
  using Deliver =
      std::function<void(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>&)>;

  // Returns the gradients of `inputs`, in order (undefined where none reached one), and hands the
  // vector parameters' to `deliver`. Call once, before the weight pass; a second call throws
  // std::logic_error.
  std::vector<at::Tensor> input_pass(const Deliver& deliver);

  // Runs the weight pass of the next node and hands its parameters' gradients to `deliver`.
  // Returns whether weight work is left.
  bool weight_step(const Deliver& deliver);
  bool weights_left() const { return next_ < work_.size(); }

 private:
  struct Work;
  void plan(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& root_grads,
            const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params);

  struct Graph;
  bool splits_ = true;
  std::unique_ptr<Graph> graph_;  // what the input pass runs over, until it has run
  std::vector<at::Tensor> root_grads_;
  std::vector<std::unique_ptr<Work>> work_;  // the weight pass, node by node
  std::size_t next_ = 0;
};

}  // namespace ferry::pipeline
