// A trained model leaving Ferry: `ferry-master export` writes a checkpoint as one state dict that
// Python reads, and `ferry-master predict` writes the masks those weights give, in one process and
// split over workers, scored against the masks a folder has.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <string>
#include <vector>

#include "ferry/models/unet.h"
#include "ferry/models/weights.h"
#include "ferry/remote_module/checkpoint.h"
#include "tests/support/temp_dir.h"
#include "tests/support/training_runs.h"

namespace {

using ferry::testing::CommandResult;
using ferry::testing::run;
using ::testing::HasSubstr;
using ::testing::Not;

class TrainedModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = ferry::testing::process_temp_dir().file("trained-model");
    std::filesystem::remove_all(dir_);
    // Two epochs of a 2-stage U-Net-ResNet-18 on 2 workers: two checkpoints kept.
    trained_ = run(std::string(FERRY_LAUNCH) + " --nproc 3 -- " + FERRY_MASTER +
                   " train --model unet-resnet18 --image-size 32 --samples 40 --batch-size 8"
                   " --epochs 2 --optimizer adam --lr 0.01 --stages 2 --checkpoint-dir " +
                   dir_ + "/ckpt");
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  void SetUp() override { ASSERT_EQ(trained_.status, 0) << trained_.output; }

  static std::string dir_;
  static CommandResult trained_;
};

std::string TrainedModel::dir_;
CommandResult TrainedModel::trained_;

// Every stage's tensors of a checkpoint, by name.
c10::Dict<std::string, at::Tensor> tensors_of(const std::string& folder) {
  return ferry::remote_module::merged_state(ferry::remote_module::read_checkpoint(folder));
}

void expect_same_tensors(const c10::Dict<std::string, at::Tensor>& a,
                         const c10::Dict<std::string, at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& item : a) {
    ASSERT_TRUE(b.contains(item.key())) << item.key();
    EXPECT_EQ(item.value().scalar_type(), b.at(item.key()).scalar_type()) << item.key();
    EXPECT_TRUE(item.value().equal(b.at(item.key()))) << item.key();
  }
}

TEST_F(TrainedModel, ExportWritesTheWholeModelForAnyKeptEpochAndPythonLoadsIt) {
  const std::string out = dir_ + "/model.pt";
  CommandResult latest =
      run(std::string(FERRY_MASTER) + " export --checkpoint-dir " + dir_ + "/ckpt --out " + out);
  ASSERT_EQ(latest.status, 0) << latest.output;
  EXPECT_THAT(latest.output, HasSubstr("of epoch 2"));
  EXPECT_THAT(latest.output,
              HasSubstr("model = smp.Unet(\"resnet18\", encoder_weights=None, classes=1)"));

  const auto exported = ferry::models::read_weights(out);
  expect_same_tensors(exported,
                      tensors_of(ferry::remote_module::latest_checkpoint_folder(dir_ + "/ckpt")));
  // Loading it into a whole U-Net finds every tensor and leaves none over: strict loading.
  ferry::models::Unet whole(18, 1);
  const ferry::models::LoadReport report = ferry::models::load_state_dict(*whole, exported);
  EXPECT_TRUE(report.ok()) << report.describe();
  EXPECT_EQ(report.loaded,
            static_cast<int64_t>(whole->named_parameters().size() + whole->named_buffers().size()));

  // The first epoch's checkpoint, kept beside the latest, is another model.
  const std::string first = dir_ + "/epoch1.pt";
  CommandResult older = run(std::string(FERRY_MASTER) + " export --checkpoint-dir " + dir_ +
                            "/ckpt --epoch 1 --out " + first);
  ASSERT_EQ(older.status, 0) << older.output;
  const auto first_tensors = ferry::models::read_weights(first);
  EXPECT_FALSE(first_tensors.at("encoder.conv1.weight").equal(exported.at("encoder.conv1.weight")));
  EXPECT_EQ(first_tensors.at("encoder.bn1.num_batches_tracked").item<int64_t>() * 2,
            exported.at("encoder.bn1.num_batches_tracked").item<int64_t>());

  CommandResult gone = run(std::string(FERRY_MASTER) + " export --checkpoint-dir " + dir_ +
                           "/ckpt --epoch 7 --out " + dir_ + "/none.pt");
  EXPECT_NE(gone.status, 0);
  EXPECT_THAT(gone.output, HasSubstr("no checkpoint of epoch 7 in \"" + dir_ +
                                     "/ckpt\" (the epochs kept: " + dir_ + "/ckpt: 1, 2)"));
  CommandResult nothing = run(std::string(FERRY_MASTER) + " export --checkpoint-dir " + dir_ +
                              "/nowhere --out " + dir_ + "/none.pt");
  EXPECT_NE(nothing.status, 0);
  EXPECT_THAT(nothing.output, HasSubstr("no checkpoint in \"" + dir_ + "/nowhere\""));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/none.pt"));

  // Python's torch.load reads the export as a dict of the same tensors under the same names.
  // Needs Python with torch (Debian's python3-torch, which `make test` installs); without it the
  // test says so, and fails under CI, where it must run.
  std::ofstream names(dir_ + "/names.txt");
  for (const auto& p : whole->named_parameters()) names << p.key() << "\n";
  for (const auto& b : whole->named_buffers()) names << b.key() << "\n";
  names.close();
  // Keys exactly the model's, every value a tensor; then saved again by Python for Ferry to read.
  std::ofstream(dir_ + "/check.py")
      << "import sys, torch\n"
         "state = torch.load(sys.argv[1])\n"
         "assert type(state) is dict, type(state)\n"
         "expected = open(sys.argv[2]).read().split()\n"
         "assert sorted(state) == sorted(expected), set(state) ^ set(expected)\n"
         "assert all(isinstance(v, torch.Tensor) for v in state.values())\n"
         "torch.save({k: v.clone() for k, v in state.items()}, sys.argv[3])\n";
  if (run("/usr/bin/python3 -c 'import torch'").status != 0) {
    if (std::getenv("CI") != nullptr) FAIL() << "no Python with torch to read the export";
    GTEST_SKIP() << "no Python with torch to read the export";
  }
  CommandResult python = run("/usr/bin/python3 " + dir_ + "/check.py " + out + " " + dir_ +
                             "/names.txt " + dir_ + "/from-python.pt");
  ASSERT_EQ(python.status, 0) << python.output;
  expect_same_tensors(ferry::models::read_weights(dir_ + "/from-python.pt"),
                      ferry::models::read_weights(out));
}

// Images of a square on noise, 32 x 32 (the trained size) but for one of 48 x 40; masks for all
// but one.
std::string write_images(const std::string& dir) {
  std::filesystem::create_directories(dir + "/images");
  std::filesystem::create_directories(dir + "/masks");
  cv::RNG rng(3);
  for (int i = 0; i < 5; ++i) {
    const int width = i == 4 ? 48 : 32, height = i == 4 ? 40 : 32;
    cv::Mat image(height, width, CV_8UC3), mask(height, width, CV_8UC1, cv::Scalar(0));
    rng.fill(image, cv::RNG::UNIFORM, 0, 255);
    cv::Rect square(rng.uniform(0, 16), rng.uniform(0, 16), 14, 14);
    image(square).setTo(cv::Scalar(255, 255, 255));
    mask(square).setTo(255);
    const std::string name = "image" + std::to_string(i);
    cv::imwrite(dir + "/images/" + name + ".png", image);
    if (i != 3) cv::imwrite(dir + "/masks/" + name + ".png", mask);
  }
  return dir;
}

// What the weights give for an image, computed here: brought to 32 x 32 as training did (padded,
// keeping its aspect), normalised as training's default (ImageNet's means and deviations), its
// part of the logits back at its own size, foreground where the logit is above zero (probability
// above one half).
at::Tensor expected_mask(ferry::models::Unet& net, const std::string& path) {
  cv::Mat bgr = cv::imread(path, cv::IMREAD_COLOR), rgb;
  // Scaled by one factor to fit, centred.
  const double scale = std::min(32.0 / bgr.rows, 32.0 / bgr.cols);
  const cv::Rect box = [&] {
    const int width = static_cast<int>(std::lround(bgr.cols * scale));
    const int height = static_cast<int>(std::lround(bgr.rows * scale));
    return cv::Rect((32 - width) / 2, (32 - height) / 2, width, height);
  }();
  cv::resize(bgr, rgb, box.size(), 0, 0, cv::INTER_AREA);
  cv::copyMakeBorder(rgb, rgb, box.y, 32 - box.y - box.height, box.x, 32 - box.x - box.width,
                     cv::BORDER_CONSTANT, cv::Scalar());
  cv::cvtColor(rgb, rgb, cv::COLOR_BGR2RGB);
  const at::Tensor mean = torch::tensor({0.485f, 0.456f, 0.406f}).view({3, 1, 1});
  const at::Tensor std = torch::tensor({0.229f, 0.224f, 0.225f}).view({3, 1, 1});
  at::Tensor image = torch::from_blob(rgb.data, {32, 32, 3}, at::kByte)
                         .permute({2, 0, 1})
                         .to(at::kFloat)
                         .div(255.0)
                         .sub(mean)
                         .div(std)
                         .unsqueeze(0);
  torch::NoGradGuard no_grad;
  const at::Tensor part =
      net->forward(image).slice(2, box.y, box.y + box.height).slice(3, box.x, box.x + box.width);
  return torch::upsample_bilinear2d(part, {bgr.rows, bgr.cols}, false)[0][0].gt(0);
}

at::Tensor mask_file(const std::string& path) {
  cv::Mat m = cv::imread(path, cv::IMREAD_GRAYSCALE);
  if (m.empty()) return {};
  return torch::from_blob(m.data, {m.rows, m.cols}, at::kByte).gt(127).clone();
}

TEST_F(TrainedModel, PredictWritesTheMasksOfTheWeightsAndScoresThem) {
  const std::string model = dir_ + "/predict-model.pt";
  ASSERT_EQ(
      run(std::string(FERRY_MASTER) + " export --checkpoint-dir " + dir_ + "/ckpt --out " + model)
          .status,
      0);
  const std::string data = write_images(dir_ + "/data");
  const std::string args = " predict --model unet-resnet18 --image-size 32 --data " + data;
  CommandResult alone = run(std::string(FERRY_MASTER) + args + " --weights " + model +
                            " --batch-size 2 --out " + dir_ + "/alone");
  ASSERT_EQ(alone.status, 0) << alone.output;
  EXPECT_THAT(alone.output, HasSubstr("5 masks written to " + dir_ + "/alone"));
  EXPECT_THAT(alone.output, HasSubstr("overall over 4 images with masks"));
  // The export's JSON says how training normalised the images; predict read it and said nothing.
  const auto about = nlohmann::json::parse(std::ifstream(dir_ + "/predict-model.json"));
  EXPECT_EQ(about["normalize"]["mean"], nlohmann::json::parse("[0.485, 0.456, 0.406]"));
  EXPECT_EQ(about["model"], "smp.Unet(\"resnet18\", encoder_weights=None, classes=1)");
  EXPECT_EQ(about["input"],
            nlohmann::json::parse(R"({"height": 32, "width": 32, "resize": "pad"})"));
  EXPECT_THAT(alone.output, Not(HasSubstr("records no normalisation")));

  ferry::models::Unet net(18, 1);
  ASSERT_TRUE(ferry::models::load_weights(*net, model).ok());
  net->eval();
  for (int i = 0; i < 5; ++i) {
    const std::string name = "image" + std::to_string(i);
    const at::Tensor written = mask_file(dir_ + "/alone/" + name + ".png");
    ASSERT_TRUE(written.defined()) << name;
    const at::Tensor expected = expected_mask(net, data + "/images/" + name + ".png");
    // Only a logit within rounding of zero could come out differently.
    EXPECT_LE(written.ne(expected).sum().item<int64_t>(), 2) << name;
  }
  // The larger image's mask has its size (it was padded to the frame and taken back out).
  EXPECT_EQ(mask_file(dir_ + "/alone/image4.png").sizes(), (std::vector<int64_t>{40, 48}));

  // The scores are those of the written masks against the true ones.
  std::ifstream csv(dir_ + "/alone/metrics.csv");
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "image,iou,dice");
  double intersection = 0, united = 0;
  for (int i : {0, 1, 2, 4}) {
    const std::string name = "image" + std::to_string(i);
    const at::Tensor p = mask_file(dir_ + "/alone/" + name + ".png");
    const at::Tensor t = mask_file(data + "/masks/" + name + ".png");
    const double both = (p & t).sum().item<double>(), either = (p | t).sum().item<double>();
    intersection += both;
    united += either;
    ASSERT_TRUE(std::getline(csv, line));
    const std::string iou = line.substr(line.find(',') + 1, line.rfind(',') - line.find(',') - 1);
    EXPECT_EQ(line.substr(0, line.find(',')), name);
    EXPECT_NEAR(std::stod(iou), either == 0 ? 1.0 : both / either, 1e-12) << line;
  }
  ASSERT_TRUE(std::getline(csv, line));
  EXPECT_EQ(line.substr(0, 8), "overall,");
  EXPECT_NEAR(std::stod(line.substr(8)), intersection / united, 1e-12) << line;

  // Split over two workers, from the checkpoint itself, at the size it records: the same masks.
  CommandResult split = run(std::string(FERRY_LAUNCH) + " --nproc 3 -- " + FERRY_MASTER +
                            " predict --model unet-resnet18 --data " + data + " --checkpoint-dir " +
                            dir_ + "/ckpt --out " + dir_ + "/split");
  ASSERT_EQ(split.status, 0) << split.output;
  for (int i = 0; i < 5; ++i) {
    const std::string name = "image" + std::to_string(i) + ".png";
    EXPECT_LE(mask_file(dir_ + "/split/" + name)
                  .ne(mask_file(dir_ + "/alone/" + name))
                  .sum()
                  .item<int64_t>(),
              2)
        << name;
  }
}

TEST(Predict, SaysWhichFileOrSettingIsWrong) {
  const std::string dir = ferry::testing::process_temp_dir().file("predict-errors");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // An untrained U-Net-ResNet-18's weights.
  const std::string model = dir + "/resnet18.pt";
  ferry::models::Unet net(18, 1);
  c10::Dict<std::string, at::Tensor> state;
  for (const auto& p : net->named_parameters()) state.insert(p.key(), p.value());
  for (const auto& b : net->named_buffers()) state.insert(b.key(), b.value());
  ferry::remote_module::save_state_dict(state, model);
  const std::string data = write_images(dir + "/wrong-data");
  CommandResult deeper = run(std::string(FERRY_MASTER) + " predict --model unet-resnet34 --data " +
                             data + " --out " + dir + "/o --weights " + model);
  EXPECT_NE(deeper.status, 0);
  EXPECT_THAT(deeper.output, HasSubstr("the weights in \"" + model +
                                       "\" are not a whole unet-resnet34 with 1 class: missing: "));
  CommandResult no_folder =
      run(std::string(FERRY_MASTER) + " predict --model unet-resnet18 --data " + dir +
          "/absent --out " + dir + "/o --weights " + model);
  EXPECT_NE(no_folder.status, 0);
  EXPECT_THAT(no_folder.output, HasSubstr("\"" + dir + "/absent\" is not a folder"));
  std::ofstream(data + "/images/image1.png", std::ios::trunc) << "not a PNG";
  CommandResult broken = run(std::string(FERRY_MASTER) + " predict --model unet-resnet18 --data " +
                             data + " --out " + dir + "/o --weights " + model);
  EXPECT_NE(broken.status, 0);
  EXPECT_THAT(broken.output, HasSubstr("cannot read \"" + data + "/images/image1.png\""));
  CommandResult both = run(std::string(FERRY_MASTER) + " predict --data " + data + " --out " + dir +
                           "/o --weights " + model + " --checkpoint-dir " + dir + "/ckpt");
  EXPECT_NE(both.status, 0);
  EXPECT_THAT(both.output, HasSubstr("excludes"));
  std::filesystem::remove_all(dir);
}

}  // namespace
