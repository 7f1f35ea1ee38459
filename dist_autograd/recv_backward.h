// The receiver's half of one recorded RPC: the grad_fn of the tensors that arrived requiring
// grad. Backward never runs it as a node: the engine stops at it and hands its input gradients
// to distributed backward, which sends them to the sender. Internal to dist_autograd/.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <string>

namespace ferry::dist_autograd {

class RecvBackward final : public torch::autograd::Node {
 public:
  RecvBackward(std::int64_t context_id, std::int64_t message_id, int from_rank)
      : context_id_(context_id), message_id_(message_id), from_rank_(from_rank) {}

  // Reached only by a local backward() through a tensor received inside a context.
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;
  std::string name() const override { return "ferry::dist_autograd::RecvBackward"; }

  std::int64_t context_id() const { return context_id_; }
  std::int64_t message_id() const { return message_id_; }
  int from_rank() const { return from_rank_; }

 private:
  std::int64_t context_id_;
  std::int64_t message_id_;
  int from_rank_;
};

}  // namespace ferry::dist_autograd
