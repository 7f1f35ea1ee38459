#include "models/block_clock.h"

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <chrono>
#include <memory>
#include <unordered_set>

namespace ferry::models {
namespace {

using Clock = std::chrono::steady_clock;
using torch::autograd::Node;
using torch::autograd::variable_list;

// A node's start (its pre-hook) and end (its post-hook), added to its block's backward.
struct NodeTiming {
  std::shared_ptr<BlockClock> clock;
  std::size_t block;
  Clock::time_point start;
};

class StartTiming : public torch::autograd::FunctionPreHook {
 public:
  explicit StartTiming(std::shared_ptr<NodeTiming> t) : t_(std::move(t)) {}
  variable_list operator()(const variable_list& grads) override {
    t_->start = Clock::now();
    return grads;
  }

 private:
  std::shared_ptr<NodeTiming> t_;
};

class EndTiming : public torch::autograd::FunctionPostHook {
 public:
  explicit EndTiming(std::shared_ptr<NodeTiming> t) : t_(std::move(t)) {}
  variable_list operator()(const variable_list& outputs, const variable_list&) override {
    t_->clock->add_backward(t_->block,
                            std::chrono::duration<double>(Clock::now() - t_->start).count());
    return outputs;
  }

 private:
  std::shared_ptr<NodeTiming> t_;
};

// Hooks every node recorded with a sequence number in [begin, end) that `outputs` reach.
void hook_nodes(BlockClock& clock, std::size_t k, const std::vector<at::Tensor>& outputs,
                std::uint64_t begin, std::uint64_t end) {
  auto made_here = [&](const Node* node) {
    return node != nullptr && node->sequence_nr() >= begin && node->sequence_nr() < end;
  };
  std::vector<Node*> stack;
  std::unordered_set<const Node*> seen;
  for (const at::Tensor& t : outputs) {
    Node* node = t.defined() ? t.grad_fn().get() : nullptr;
    if (made_here(node) && seen.insert(node).second) stack.push_back(node);
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    auto timing = std::make_shared<NodeTiming>(NodeTiming{clock.shared_from_this(), k, {}});
    node->add_pre_hook(std::make_unique<StartTiming>(timing));
    node->add_post_hook(std::make_unique<EndTiming>(timing));
    for (const auto& edge : node->next_edges()) {
      Node* down = edge.function.get();
      if (made_here(down) && seen.insert(down).second) stack.push_back(down);
    }
  }
}

}  // namespace

BlockClock::BlockClock(std::size_t blocks) : forward_(blocks, 0.0), backward_(blocks, 0.0) {}

std::vector<at::Tensor> BlockClock::run(std::size_t k, const Block& block,
                                        std::vector<at::Tensor> carry) {
  const bool records = torch::autograd::GradMode::is_enabled();
  const std::uint64_t begin = at::sequence_number::peek();
  const auto start = Clock::now();
  carry = block(std::move(carry));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    forward_.at(k) += seconds;
  }
  if (records) hook_nodes(*this, k, carry, begin, at::sequence_number::peek());
  return carry;
}

void BlockClock::add_backward(std::size_t k, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  backward_.at(k) += seconds;
}

std::vector<double> BlockClock::forward_s() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return forward_;
}

std::vector<double> BlockClock::backward_s() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return backward_;
}

}  // namespace ferry::models
