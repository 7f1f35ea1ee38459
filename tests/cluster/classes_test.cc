// Masks of classes end to end, as a user runs them: the multi-class synthetic set learned on two
// pipelined stages with the loss on the last stage (its options travelling with it), per-class
// figures in every report, a folder of palette masks with an ignore index and its names in
// classes.txt, prediction writing class ids, and settings that cannot work refused before any
// worker starts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <string>
#include <vector>

#include "ferry/models/unet.h"
#include "ferry/models/weights.h"
#include "ferry/remote_module/checkpoint.h"
#include "tests/support/palette_png.h"
#include "tests/support/temp_dir.h"
#include "tests/support/training_runs.h"

namespace {

using ferry::testing::CommandResult;
using ferry::testing::run;
using ::testing::HasSubstr;

TEST(Classes, TwoPipelinedStagesLearnTheMultiClassSyntheticSet) {
  const auto& temp = ferry::testing::process_temp_dir();
  const std::string metrics = temp.file("classes.json"), logs = temp.file("classes-logs");
  const std::string checkpoints = temp.file("classes-checkpoints");
  CommandResult r = run(std::string(FERRY_LAUNCH) + " --nproc 3 -- " + FERRY_MASTER +
                        " train --model unet-resnet18 --classes 3 --image-size 64 --samples 320"
                        " --epochs 4 --batch-size 8 --optimizer adam --lr 0.003 --stages 2"
                        " --pipeline 1f1b --microbatches 2 --loss ce+dice --ignore-index 255"
                        " --class-weights 0.5,1,1 --monitor val_miou --save-best"
                        " --checkpoint-dir " +
                        checkpoints + " --metrics-file " + metrics + " --log-dir " + logs);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the loss on the last stage")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("IoU by class: background ")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the last validation by class:")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("best epoch: ")) << r.output;
  const auto report = nlohmann::json::parse(std::ifstream(metrics));
  const auto& epochs = report["epochs"];
  ASSERT_EQ(epochs.size(), 4u) << r.output;
  // The mean IoU of the foreground classes (ellipses and polygons) clearly above chance: calling
  // every pixel one shape gives about 0.1 each, and guessing a class per image by its colours
  // cannot tell the kinds apart.
  double best = 0;
  for (const auto& epoch : epochs) best = std::max(best, epoch["val_iou"].get<double>());
  EXPECT_GT(best, 0.4) << epochs.dump();
  EXPECT_LT(epochs.back()["train_loss"].get<double>(),
            0.7 * epochs.front()["train_loss"].get<double>())
      << epochs.dump();
  EXPECT_EQ(report["monitor"], "val_miou");
  for (const char* name : {"background", "ellipse", "polygon"}) {
    EXPECT_TRUE(epochs.back()["classes"].contains(name)) << epochs.back().dump();
  }
  // metrics.csv: a column per class, the same figures.
  auto rows = ferry::testing::read_metrics_csv(logs + "/metrics.csv");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows.back()["val_iou_ellipse"],
            epochs.back()["classes"]["ellipse"]["iou"].get<double>());
  EXPECT_EQ(rows.back()["val_miou"], epochs.back()["val_miou"].get<double>());
  EXPECT_TRUE(ferry::testing::parses_as_svg(logs + "/metrics.svg"));
  std::filesystem::remove_all(logs);
  std::filesystem::remove_all(checkpoints);
  std::remove(metrics.c_str());
}

// Red squares (class 1) and green discs (class 2) on noise, with a border of 255 around each
// shape, and their names in classes.txt; 48 wide and 72 high.
std::string write_classes_folder(const std::string& dir, int count) {
  std::filesystem::create_directories(dir + "/images");
  std::filesystem::create_directories(dir + "/masks");
  std::ofstream(dir + "/classes.txt") << "sky\nbrick\n\nleaf\n";
  cv::RNG rng(11);
  for (int i = 0; i < count; ++i) {
    cv::Mat image(72, 48, CV_8UC3), ids(72, 48, CV_8UC1, cv::Scalar(0));
    rng.fill(image, cv::RNG::UNIFORM, 0, 255);
    const cv::Rect square(rng.uniform(2, 20), rng.uniform(2, 20), 14, 14);
    const cv::Point centre(rng.uniform(30, 40), rng.uniform(30, 40));
    cv::rectangle(ids, square, cv::Scalar(255), 2);
    cv::circle(ids, centre, 8, cv::Scalar(255), 2);
    ids(square).setTo(1);
    cv::circle(ids, centre, 7, cv::Scalar(2), cv::FILLED);
    image.setTo(cv::Scalar(0, 0, 255), ids == 1);
    image.setTo(cv::Scalar(0, 255, 0), ids == 2);
    const std::string name = "image" + std::to_string(i);
    cv::imwrite(dir + "/images/" + name + ".png", image);
    ferry::testing::write_palette_png(dir + "/masks/" + name + ".png", ids);
  }
  return dir;
}

// The export of the checkpoints' latest loads strictly into smp's Unet(classes=3), written out in
// Python on torchvision's ResNet (tests/support/smp_unet.py), and gives there the logits Ferry's
// U-Net gives for the same input. Needs Python with torch and torchvision (Debian's, which `make
// test` installs); without them the check says so, and fails under CI, where it must run.
void expect_export_loads_into_smp(const std::string& checkpoints) {
  const std::string model = checkpoints + "/model.pt", io = checkpoints + "/io.pt";
  CommandResult exported = run(std::string(FERRY_MASTER) + " export --checkpoint-dir " +
                               checkpoints + " --out " + model);
  ASSERT_EQ(exported.status, 0) << exported.output;
  EXPECT_THAT(exported.output,
              HasSubstr("smp.Unet(\"resnet18\", encoder_weights=None, classes=3)"));
  ferry::models::Unet net(18, 3);
  ASSERT_TRUE(ferry::models::load_weights(*net, model).ok());
  net->eval();
  torch::NoGradGuard no_grad;
  const at::Tensor input = torch::randn({2, 3, 64, 32}, at::detail::createCPUGenerator(5));
  c10::Dict<std::string, at::Tensor> tensors;
  tensors.insert("input", input);
  tensors.insert("logits", net->forward(input));
  ferry::remote_module::save_state_dict(tensors, io);
  if (run("/usr/bin/python3 -c 'import torch, torchvision'").status != 0) {
    if (std::getenv("CI") != nullptr) FAIL() << "no Python with torch and torchvision";
    std::cerr << "not checked: no Python with torch and torchvision to load the export\n";
    return;
  }
  CommandResult python = run("/usr/bin/python3 " FERRY_SOURCE_DIR "/tests/support/smp_unet.py " +
                             model + " 18 3 " + io);
  EXPECT_EQ(python.status, 0) << python.output;
  EXPECT_THAT(python.output, HasSubstr("logits (2, 3, 64, 32): largest difference"));
  std::cerr << "smp's U-Net in Python: " << python.output;
}

// At a size of another aspect than the images' (64 high, 32 wide): padded to it in training, and
// predicted at the size the checkpoint records, each mask at its image's size.
TEST(Classes, AFolderOfPaletteMasksTrainsWithItsNamesAndPredictWritesClassIds) {
  const auto& temp = ferry::testing::process_temp_dir();
  const std::string data = write_classes_folder(temp.file("palette-data"), 12);
  const std::string validation = write_classes_folder(temp.file("palette-validation"), 3);
  const std::string checkpoints = temp.file("palette-checkpoints"), out = temp.file("palette-out");
  CommandResult r =
      run(std::string(FERRY_LAUNCH) + " --nproc 3 -- " + FERRY_MASTER +
          " train --model unet-resnet18 --classes 3 --ignore-index 255 --data " + data +
          " --val-data " + validation +
          " --image-size 64,32 --batch-size 4 --epochs 2 --stages 2 --checkpoint-dir " +
          checkpoints + " --metrics-file " + checkpoints + ".json");
  ASSERT_EQ(r.status, 0) << r.output;
  // Every image of --data trains (three batches of four), those of --val-data validate.
  EXPECT_THAT(r.output, HasSubstr("validation: 3 image/mask pairs from " + validation)) << r.output;
  const auto report = nlohmann::json::parse(std::ifstream(checkpoints + ".json"));
  EXPECT_EQ(report["epochs"][0]["batches"], 3) << r.output;
  std::remove((checkpoints + ".json").c_str());
  EXPECT_THAT(r.output, HasSubstr("IoU by class: sky ")) << r.output;
  EXPECT_THAT(r.output, HasSubstr(", leaf ")) << r.output;
  const std::string latest = ferry::remote_module::latest_checkpoint_folder(checkpoints);
  EXPECT_EQ(ferry::remote_module::read_checkpoint_value(latest, "image_size").toStringRef(),
            "64,32");
  EXPECT_EQ(ferry::remote_module::read_checkpoint_value(latest, "resize").toStringRef(), "pad");

  CommandResult p = run(std::string(FERRY_MASTER) +
                        " predict --model unet-resnet18 --classes 3 --ignore-index 255"
                        " --overlay --data " +
                        data + " --checkpoint-dir " + checkpoints + " --out " + out);
  ASSERT_EQ(p.status, 0) << p.output;
  EXPECT_THAT(p.output, HasSubstr("overall over 12 images with masks")) << p.output;
  EXPECT_THAT(p.output, HasSubstr("mIoU ")) << p.output;
  cv::Mat written = cv::imread(out + "/image0.png", cv::IMREAD_UNCHANGED);
  ASSERT_FALSE(written.empty());
  EXPECT_EQ(written.size(), cv::Size(48, 72));  // the image's own size
  double low, high;
  cv::minMaxLoc(written, &low, &high);
  EXPECT_LE(high, 2);  // class ids, not 0 and 255
  // The overlay: the image, half coloured where a class was found.
  cv::Mat overlay = cv::imread(out + "/image0.overlay.png", cv::IMREAD_COLOR);
  const cv::Mat image = cv::imread(data + "/images/image0.png", cv::IMREAD_COLOR);
  ASSERT_EQ(overlay.size(), image.size());
  EXPECT_EQ(cv::countNonZero(written > 0) > 0, cv::norm(overlay, image, cv::NORM_INF) > 0);
  expect_export_loads_into_smp(checkpoints);
  std::filesystem::remove_all(data);
  std::filesystem::remove_all(validation);
  std::filesystem::remove_all(checkpoints);
  std::filesystem::remove_all(out);
}

TEST(Classes, SettingsThatDisagreeWithTheMasksAreRefusedBeforeAnyWorkerStarts) {
  const std::string train = std::string(FERRY_LAUNCH) + " --nproc 3 -- " + FERRY_MASTER +
                            " train --model unet-resnet18 --image-size 32 --samples 16";
  struct Case {
    std::string flags, message;
  };
  for (const Case& c : std::vector<Case>{
           {" --classes 3 --loss bce", "--loss bce compares one logit per pixel"},
           {" --classes 3 --class-weights 1,2", "--class-weights has 2 values for --classes 3"},
           {" --classes 6", "--classes 6: the synthetic set has 1 class"},
           {" --classes 3 --ignore-index 1", "--ignore-index 1 is the id of one of the classes"},
       }) {
    CommandResult r = run(train + c.flags);
    EXPECT_NE(r.status, 0) << c.flags;
    EXPECT_THAT(r.output, HasSubstr(c.message)) << c.flags << "\n" << r.output;
    EXPECT_THAT(r.output, ::testing::Not(HasSubstr("epoch 1/"))) << c.flags;
  }
}

}  // namespace
