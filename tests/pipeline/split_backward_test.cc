// The backward split into an input pass and a weight pass, on graphs in this process: the two
// passes give the gradients of one whole backward, the input pass computes no parameter's, and a
// parameter used twice keeps the backward whole.
#include "pipeline/split_backward.h"

#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <map>

namespace ferry::pipeline {
namespace {

// A small convolutional stage with batch norm, a residual addition and a linear head, so that
// the weights' gradients come through convolution, batch-norm and transposed-matrix nodes.
struct ConvStage : torch::nn::Module {
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d norm{nullptr};
  torch::nn::Linear head{nullptr};
  ConvStage() {
    conv1 =
        register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3).padding(1)));
    norm = register_module("norm", torch::nn::BatchNorm2d(4));
    conv2 =
        register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(4, 3, 3).padding(1)));
    head = register_module("head", torch::nn::Linear(3 * 5 * 5, 2));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = torch::relu(norm(conv1(x)));
    h = conv2(h) + x;
    return head(h.flatten(1));
  }
};

struct Gradients {
  std::vector<at::Tensor> inputs;
  std::map<const void*, at::Tensor> params;
};

Gradients whole(const at::Tensor& root, const at::Tensor& root_grad,
                const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> targets = inputs;
  targets.insert(targets.end(), params.begin(), params.end());
  std::vector<at::Tensor> found =
      torch::autograd::grad({root}, targets, {root_grad}, /*retain_graph=*/false,
                            /*create_graph=*/false, /*allow_unused=*/true);
  Gradients out;
  out.inputs.assign(found.begin(), found.begin() + static_cast<long>(inputs.size()));
  for (size_t k = 0; k < params.size(); ++k) {
    out.params[params[k].unsafeGetTensorImpl()] = found[inputs.size() + k];
  }
  return out;
}

// Both passes; `steps` counts the weight pass's nodes.
Gradients split(const at::Tensor& root, const at::Tensor& root_grad,
                const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params,
                int* steps) {
  SplitBackward backward({root}, {root_grad}, inputs, params);
  EXPECT_TRUE(backward.splits());
  Gradients out;
  auto add = [&](const std::vector<at::Tensor>& ps, const std::vector<at::Tensor>& grads) {
    for (size_t k = 0; k < ps.size(); ++k) {
      at::Tensor& sum = out.params[ps[k].unsafeGetTensorImpl()];
      sum = sum.defined() ? sum + grads[k] : grads[k];
    }
  };
  out.inputs = backward.input_pass(add);
  *steps = 0;
  while (backward.weights_left()) {
    backward.weight_step(add);
    ++*steps;
  }
  return out;
}

void expect_same(const Gradients& got, const Gradients& want) {
  ASSERT_EQ(got.inputs.size(), want.inputs.size());
  for (size_t i = 0; i < want.inputs.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got.inputs[i], want.inputs[i], 1e-5, 1e-6)) << "input " << i;
  }
  ASSERT_EQ(got.params.size(), want.params.size());
  for (const auto& [param, grad] : want.params) {
    ASSERT_TRUE(got.params.count(param));
    EXPECT_TRUE(torch::allclose(got.params.at(param), grad, 1e-5, 1e-6));
  }
}

TEST(SplitBackward, TheTwoPassesGiveTheGradientsOfOneWholeBackward) {
  torch::manual_seed(3);
  ConvStage stage;
  std::vector<at::Tensor> params = stage.parameters();
  at::Tensor x = torch::randn({4, 3, 5, 5});
  at::Tensor root_grad = torch::randn({4, 2});
  for (bool first_stage : {false, true}) {
    SCOPED_TRACE(first_stage ? "no input gradient (a first stage)" : "with the input's gradient");
    std::vector<at::Tensor> inputs;
    at::Tensor in = x.clone();
    if (!first_stage) inputs.push_back(in.requires_grad_());
    const Gradients want = whole(stage.forward(in), root_grad, inputs, params);
    int steps = 0;
    const Gradients got = split(stage.forward(in), root_grad, inputs, params, &steps);
    expect_same(got, want);
    // One node per layer with a weight matrix or kernel (the linear layer's through its
    // transposed weight; the batch norm's vectors come with the input pass), or the roots' one
    // pass where nothing waits for an input's gradient.
    EXPECT_EQ(steps, first_stage ? 1 : 3);
  }
}

// Which of its gradients a node computed each time it ran.
class RecordOutputs : public torch::autograd::FunctionPostHook {
 public:
  explicit RecordOutputs(std::vector<std::vector<bool>>* runs) : runs_(runs) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    std::vector<bool> defined;
    for (const at::Tensor& t : outputs) defined.push_back(t.defined());
    runs_->push_back(defined);
    return outputs;
  }

 private:
  std::vector<std::vector<bool>>* runs_;
};

TEST(SplitBackward, TheInputPassComputesOnlyVectorParametersGradientsAndTheWeightPassNoInputs) {
  torch::manual_seed(4);
  ConvStage stage;
  at::Tensor in = torch::randn({2, 3, 5, 5}).requires_grad_();
  at::Tensor out = stage.forward(in);
  // The head's node: its gradients are the bias's, the input's and the transposed weight's.
  std::vector<std::vector<bool>> runs;
  out.grad_fn()->add_post_hook(std::make_unique<RecordOutputs>(&runs));
  SplitBackward backward({out}, {torch::ones_like(out)}, {in}, stage.parameters());
  std::vector<at::Tensor> early;  // what the input pass delivers: the batch norm's two vectors
  auto keep = [&](const std::vector<at::Tensor>& params, const std::vector<at::Tensor>&) {
    early.insert(early.end(), params.begin(), params.end());
  };
  std::vector<at::Tensor> grads = backward.input_pass(keep);
  ASSERT_EQ(grads.size(), 1u);
  EXPECT_EQ(grads[0].sizes(), in.sizes());
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0], (std::vector<bool>{false, true, false}));
  ASSERT_EQ(early.size(), 2u);
  EXPECT_TRUE(early[0].is_same(stage.norm->weight));
  EXPECT_TRUE(early[1].is_same(stage.norm->bias));
  while (backward.weights_left()) backward.weight_step([](const auto&, const auto&) {});
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[1], (std::vector<bool>{true, false, true}));
  EXPECT_THROW(backward.input_pass(keep), std::logic_error);
}

TEST(SplitBackward, AParameterUsedTwiceKeepsTheBackwardWhole) {
  torch::nn::Linear shared(4, 4);
  at::Tensor in = torch::randn({3, 4}).requires_grad_();
  at::Tensor out = shared(torch::relu(shared(in)));
  SplitBackward backward({out}, {torch::ones_like(out)}, {in}, shared->parameters());
  EXPECT_FALSE(backward.splits());
  EXPECT_FALSE(backward.weights_left());
}

}  // namespace
}  // namespace ferry::pipeline
