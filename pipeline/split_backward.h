// One micro-batch's backward on one stage in two passes, for the zero-bubble schedule. The input
// pass computes only what the stage before waits for: the gradients of the stage's inputs (and of
// the portals' anchors). At each node that also computes a parameter's gradient it keeps the
// gradient that reached the node. The weight pass runs later, node by node: each such node
// computes only its parameters' part from what it kept, so no node's input gradient is computed
// twice. Private to pipeline/.
//
// After the input pass every edge between the nodes it ran is cut: a node that computes no
// parameter's gradient (a ReLU, an addition) frees its saved tensors at once, and each node of the
// weight pass frees its own when its part is done. What stays between the passes is the saved
// tensors of the nodes that compute parameters' gradients (a convolution's input, a batch norm's
// statistics) and the gradients that reached them.
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

  // The gradients of `inputs`, in order (undefined where none reached one). Call once, before
  // the weight pass; a second call throws std::logic_error.
  std::vector<at::Tensor> input_pass();

  // Gives parameters and their gradients, fresh from a pass whose graph is gone.
  using Deliver =
      std::function<void(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>&)>;
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
