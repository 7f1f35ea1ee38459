// The built-in losses: their specs as they travel to a stage, what each refuses, and their values
// against PyTorch's own computation (cross-entropy) and segmentation_models_pytorch's formulas
// written out in Python (multi-class Dice and focal), with and without an ignore index and class
// weights.
#include "ferry/remote_module/loss.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>

#include "ferry/models/weights.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"
#include "tests/support/training_runs.h"

namespace ferry::remote_module {
namespace {

using ferry::testing::kind_and_error_of;
using ferry::testing::process_temp_dir;
using ::testing::HasSubstr;

float loss_value(const std::string& spec, const at::Tensor& logits, const at::Tensor& target) {
  return loss_function(spec)(logits, target).item<float>();
}

TEST(LossSpec, ItsTextCarriesTheOptionsExactly) {
  LossSpec spec{"ce", {255, {0.1, 1.0 / 3, 2}}};
  EXPECT_EQ(LossSpec::parse(spec.to_string()).options, spec.options);
  EXPECT_EQ(LossSpec::parse(spec.to_string()).name, "ce");
  EXPECT_EQ((LossSpec{"bce+dice", {}}).to_string(), "bce+dice");
  EXPECT_EQ(LossSpec::parse("dice;ignore_index=255").options.ignore_index, 255);
  EXPECT_THAT(
      kind_and_error_of([] { LossSpec::parse("ce;weights=1,2"); }),
      HasSubstr("InvalidArgument: loss \"ce;weights=1,2\": unknown option \"weights=1,2\""));
  EXPECT_THAT(kind_and_error_of([] { LossSpec::parse("ce;class_weights=1,x"); }),
              HasSubstr("\"x\" is not a number"));
}

TEST(Losses, EachRefusesWhatItCannotComputeNamingWhy) {
  const at::Tensor four = torch::randn({2, 4, 3, 3});
  const at::Tensor ids = torch::randint(0, 4, {2, 1, 3, 3});
  EXPECT_THAT(kind_and_error_of([&] { loss_value("bce", four, ids); }),
              HasSubstr("the loss \"bce\" compares logits of shape [2, 4, 3, 3] with targets of "
                        "the same shape, not [2, 1, 3, 3]; for masks of class ids use ce"));
  EXPECT_THAT(kind_and_error_of([&] {
                loss_value("ce", torch::randn({2, 1, 3, 3}), ids);
              }),
              HasSubstr("the loss \"ce\" needs logits of 2 or more classes"));
  EXPECT_THAT(kind_and_error_of([&] { loss_value("ce;class_weights=1,2,3", four, ids); }),
              HasSubstr("--class-weights has 3 values for 4 classes"));
  EXPECT_THAT(kind_and_error_of([&] { loss_function("dice;class_weights=1,2"); }),
              HasSubstr("the loss \"dice\" takes no class weights"));
  EXPECT_THAT(kind_and_error_of([&] { loss_function("mse;ignore_index=3"); }),
              HasSubstr("the loss \"mse\" takes no ignore index or class weights"));
  EXPECT_THAT(kind_and_error_of([&] { loss_function("lovasz"); }),
              HasSubstr("unknown loss \"lovasz\""));
  EXPECT_THAT(kind_and_error_of([] { register_loss("focal", nullptr); }),
              HasSubstr("loss \"focal\" is already registered"));
}

// An ignored pixel changes nothing, whatever its logits; a batch of ignored pixels gives 0, not
// NaN.
TEST(Losses, IgnoredPixelsCountInNoLoss) {
  torch::manual_seed(3);
  at::Tensor logits = torch::randn({2, 3, 4, 4});
  at::Tensor ids = torch::randint(0, 3, {2, 1, 4, 4});
  ids.index_put_({0, 0, 1}, 255);
  at::Tensor other = logits.clone();
  other.select(0, 0).select(1, 1).fill_(9);  // only the ignored row's logits differ
  for (const std::string name : {"ce", "dice", "focal", "ce+dice"}) {
    const std::string spec = name + ";ignore_index=255";
    EXPECT_FLOAT_EQ(loss_value(spec, logits, ids), loss_value(spec, other, ids)) << name;
    at::Tensor all_ignored = torch::full_like(ids, 255);
    at::Tensor x = logits.clone().requires_grad_();
    at::Tensor value = loss_function(spec)(x, all_ignored);
    value.backward();
    EXPECT_EQ(value.item<float>(), 0.0f) << name;
    EXPECT_TRUE(torch::isfinite(x.grad()).all().item<bool>()) << name;
  }
  at::Tensor masks = torch::randint(0, 2, {2, 1, 4, 4}).to(torch::kFloat);
  masks.index_put_({1, 0, 2}, 255);
  at::Tensor binary = torch::randn({2, 1, 4, 4}), changed = binary.clone();
  changed.select(0, 1).select(1, 2).fill_(-7);
  for (const std::string name : {"bce", "dice", "focal", "bce+dice"}) {
    const std::string spec = name + ";ignore_index=255";
    EXPECT_FLOAT_EQ(loss_value(spec, binary, masks), loss_value(spec, changed, masks)) << name;
  }
}

// Python writes logits, class ids (a tenth of them 255) and what torch's cross_entropy and smp's
// multi-class Dice and focal losses (written out as smp's losses module computes them) give for
// them; Ferry's losses give the same to 1e-6. Needs Python with torch (Debian's python3-torch,
// which `make test` installs); without it the test says so, and fails under CI, where it must run.
TEST(Losses, MultiClassLossesEqualPyTorchsComputation) {
  const std::string script = process_temp_dir().file("losses.py"),
                    file = process_temp_dir().file("losses.pt");
  std::ofstream(script) << R"(import sys, torch
import torch.nn.functional as F
torch.manual_seed(7)
x = torch.randn(3, 4, 9, 7) * 2
t = torch.randint(0, 4, (3, 9, 7))
ti = t.clone()
ti[torch.rand(3, 9, 7) < 0.1] = 255
w = torch.tensor([0.2, 1.0, 3.0, 0.5])

def dice(x, t, ignore=None):  # smp DiceLoss(mode="multiclass")
    bs, k = x.size(0), x.size(1)
    p = x.log_softmax(dim=1).exp().view(bs, k, -1)
    t = t.view(bs, -1)
    if ignore is not None:
        m = t != ignore
        p = p * m.unsqueeze(1)
        y = F.one_hot((t * m).long(), k).permute(0, 2, 1) * m.unsqueeze(1)
    else:
        y = F.one_hot(t, k).permute(0, 2, 1)
    y = y.type_as(p)
    score = (2 * (p * y).sum((0, 2))) / (p + y).sum((0, 2)).clamp_min(1e-7)
    return ((1 - score) * ((y.sum((0, 2)) > 0).float())).mean()

def focal(x, t, ignore=None):  # smp FocalLoss(mode="multiclass"), gamma 2, no alpha
    loss = 0
    keep = t != ignore if ignore is not None else torch.ones_like(t, dtype=torch.bool)
    for c in range(x.size(1)):
        yc, xc = (t == c).float()[keep], x[:, c][keep]
        logpt = F.binary_cross_entropy_with_logits(xc, yc, reduction="none")
        loss = loss + ((1 - torch.exp(-logpt)) ** 2 * logpt).mean()
    return loss

out = {"x": x, "t": t, "ti": ti,
       "ce": F.cross_entropy(x, t), "ce_i": F.cross_entropy(x, ti, ignore_index=255),
       "ce_w": F.cross_entropy(x, t, weight=w),
       "ce_wi": F.cross_entropy(x, ti, weight=w, ignore_index=255),
       "dice": dice(x, t), "dice_i": dice(x, ti, 255),
       "focal": focal(x, t), "focal_i": focal(x, ti, 255)}
torch.save({k: v.reshape(v.shape) for k, v in out.items()}, sys.argv[1])
)";
  const ferry::testing::CommandResult python =
      ferry::testing::run("/usr/bin/python3 " + script + " " + file);
  if (python.status != 0) {
    if (std::getenv("CI") != nullptr) {
      FAIL() << "no Python with torch to compute the losses: " << python.output;
    }
    GTEST_SKIP() << "no Python with torch to compute the losses: " << python.output;
  }
  auto py = models::read_weights(file);
  const at::Tensor x = py.at("x"), t = py.at("t").unsqueeze(1), ti = py.at("ti");
  const std::string weights = ";class_weights=0.2,1,3,0.5", ignore = ";ignore_index=255";
  auto expect = [&](const std::string& key, const std::string& spec, const at::Tensor& target) {
    EXPECT_NEAR(loss_value(spec, x, target), py.at(key).item<float>(), 1e-6) << spec;
  };
  expect("ce", "ce", t);
  expect("ce_i", "ce" + ignore, ti);
  expect("ce_w", "ce" + weights, t);
  expect("ce_wi", "ce" + weights + ignore, ti);
  expect("dice", "dice", t);
  expect("dice_i", "dice" + ignore, ti);
  expect("focal", "focal", t);
  expect("focal_i", "focal" + ignore, ti);
  EXPECT_NEAR(loss_value("ce+dice" + ignore, x, ti),
              py.at("ce_i").item<float>() + py.at("dice_i").item<float>(), 2e-6);
}

}  // namespace
}  // namespace ferry::remote_module
