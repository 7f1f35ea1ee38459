// The folder data set: files paired by name, resized or cropped, flipped with their masks, and
// every bad file an error that names it, also when it is read on a loader's thread.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>

#include "ferry/data/dataset.h"
#include "tests/support/error_of.h"

namespace ferry::data {
namespace {

using ferry::testing::error_of;

namespace fs = std::filesystem;

class FolderData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ferry-folder-" + std::to_string(getpid()));
    fs::create_directories(dir_ / "images");
    fs::create_directories(dir_ / "masks");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A red rectangle (x < split) on blue, and its mask with `on` where the rectangle is.
  void write_pair(const std::string& image, const std::string& mask, int width, int height,
                  int split, uchar on = 255) {
    cv::Mat pixels(height, width, CV_8UC3, cv::Scalar(255, 0, 0));  // BGR: blue
    cv::Mat labels(height, width, CV_8UC1, cv::Scalar(0));
    pixels(cv::Rect(0, 0, split, height)).setTo(cv::Scalar(0, 0, 255));  // red
    labels(cv::Rect(0, 0, split, height)).setTo(on);
    ASSERT_TRUE(cv::imwrite((dir_ / "images" / image).string(), pixels));
    ASSERT_TRUE(cv::imwrite((dir_ / "masks" / mask).string(), labels));
  }
  std::string dir() const { return dir_.string(); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

FolderDataset::Options sized(int64_t size, bool crop = false, bool augment = false) {
  FolderDataset::Options options;
  options.image_size = size;
  options.crop = crop;
  options.augment = augment;
  return options;
}

// Foreground is exactly where the image is red, in RGB order.
void expect_mask_follows_red(const Sample& s) {
  at::Tensor red = (s.image[0] > 0.5) & (s.image[2] < 0.5);
  EXPECT_TRUE(red.equal(s.mask[0] > 0.5));
}

TEST_F(FolderData, PairsFilesByNameResizesAndReadsBothMaskConventions) {
  write_pair("a.png", "a.png", 40, 30, 20);
  write_pair("b.png", "b.png", 64, 64, 16, /*on=*/1);
  write_pair("c.png", "c.png", 32, 32, 8);
  FolderDataset set(dir(), sized(32));
  ASSERT_EQ(set.size(), 3u);
  for (std::size_t i = 0; i < set.size(); ++i) {
    Sample s = set.get(i);
    EXPECT_EQ(s.image.sizes(), (std::vector<int64_t>{3, 32, 32}));
    EXPECT_EQ(s.mask.sizes(), (std::vector<int64_t>{1, 32, 32}));
    EXPECT_GE(s.image.min().item<float>(), 0);
    EXPECT_LE(s.image.max().item<float>(), 1);
    EXPECT_TRUE(((s.mask == 0) | (s.mask == 1)).all().item<bool>());
    expect_mask_follows_red(s);
  }
  // 40x30 with 20 columns red -> half of 32 columns; 64 wide with 16 -> a quarter.
  EXPECT_FLOAT_EQ(set.get(0).mask.mean().item<float>(), 0.5f);
  EXPECT_FLOAT_EQ(set.get(1).mask.mean().item<float>(), 0.25f);
}

TEST_F(FolderData, CropsFromTheCentreAndAugmentationFlipsImageAndMaskTogether) {
  write_pair("wide.png", "wide.png", 64, 32, 24);
  FolderDataset centre(dir(), sized(32, /*crop=*/true));
  Sample s = centre.get(0);
  // Columns 16..47 of the original: red up to 24, so 8 of 32 columns.
  EXPECT_FLOAT_EQ(s.mask.mean().item<float>(), 0.25f);
  EXPECT_FLOAT_EQ(s.mask[0][0][7].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(s.mask[0][0][8].item<float>(), 0.0f);

  FolderDataset augmented(dir(), sized(32, /*crop=*/true, /*augment=*/true));
  bool saw_flip = false, saw_shift = false;
  for (int draw = 0; draw < 40; ++draw) {
    Sample a = augmented.get(0);
    expect_mask_follows_red(a);
    saw_flip |= a.mask[0][0][31].item<float>() == 1.0f;
    saw_shift |= a.mask.mean().item<float>() != 0.25f;
  }
  EXPECT_TRUE(saw_flip);
  EXPECT_TRUE(saw_shift);
}

TEST_F(FolderData, BadFoldersAndFilesAreErrorsThatNameThem) {
  EXPECT_NE(error_of([&] { FolderDataset(file("nowhere"), sized(32)); }).find("nowhere/images"),
            std::string::npos);
  EXPECT_NE(error_of([&] { FolderDataset(dir(), sized(32)); }).find("no PNG or JPEG files"),
            std::string::npos);

  write_pair("a.png", "a.png", 32, 32, 8);
  cv::imwrite(file("images/lonely.jpg"), cv::Mat(8, 8, CV_8UC3, cv::Scalar(0)));
  std::string error = error_of([&] { FolderDataset(dir(), sized(32)); });
  EXPECT_NE(error.find("images/lonely.jpg\" has no mask"), std::string::npos) << error;
  fs::remove(file("images/lonely.jpg"));

  cv::imwrite(file("images/small.png"), cv::Mat(16, 16, CV_8UC3, cv::Scalar(0)));
  cv::imwrite(file("masks/small.png"), cv::Mat(16, 12, CV_8UC1, cv::Scalar(0)));
  std::ofstream(file("images/broken.png")) << "not a png";
  cv::imwrite(file("masks/broken.png"), cv::Mat(8, 8, CV_8UC1, cv::Scalar(0)));
  FolderDataset set(dir(), sized(32));
  ASSERT_EQ(set.size(), 3u);  // a, broken, small: sorted by name
  error = error_of([&] { set.get(1); });
  EXPECT_NE(error.find("cannot read \"" + file("images/broken.png")), std::string::npos) << error;
  error = error_of([&] { set.get(2); });
  EXPECT_NE(error.find("mask \"" + file("masks/small.png") + "\" is 12x16"), std::string::npos)
      << error;
  error = error_of([&] { FolderDataset(dir(), sized(48, /*crop=*/true)).get(0); });
  EXPECT_NE(error.find(file("images/a.png") + "\" is 32x32, smaller than the 48x48 crop"),
            std::string::npos)
      << error;
}

TEST_F(FolderData, ALoaderThreadsFailureComesOutOfNextNamingTheFile) {
  for (int i = 0; i < 5; ++i) {
    write_pair(std::to_string(i) + ".png", std::to_string(i) + ".png", 32, 32, 4 * i + 1);
  }
  std::ofstream(file("images/3.png"), std::ios::trunc) << "truncated";
  auto set = std::make_shared<FolderDataset>(dir(), sized(32));
  BatchLoader loader(set, {0, 1, 2, 3, 4}, 2, std::nullopt, /*drop_last=*/true, /*threads=*/2);
  loader.start_epoch(0);
  auto first = loader.next();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->images.sizes(), (std::vector<int64_t>{2, 3, 32, 32}));
  std::string error = error_of([&] { loader.next(); });
  EXPECT_NE(error.find("images/3.png"), std::string::npos) << error;
  EXPECT_FALSE(loader.next().has_value());  // the epoch ends; nothing hangs
  EXPECT_EQ(loader.batches(), 2u);          // sample 4 alone would be a batch of one
  loader.start_epoch(1);                    // and the next one starts afresh
  EXPECT_TRUE(loader.next().has_value());
}

// What predict reads and writes: one image as training resizes it, with its own size; a mask at
// its own size; a written mask read back.
TEST_F(FolderData, SingleImagesAndMasksReadAsTheDataSetReadsThemAndMasksWriteBack) {
  write_pair("a.png", "a.png", 12, 8, 6, 1);
  ImageFile image = read_image(file("images/a.png"), 4);
  EXPECT_EQ(image.height, 8);
  EXPECT_EQ(image.width, 12);
  FolderDataset set(dir(), sized(4));
  EXPECT_TRUE(image.pixels.equal(set.get(0).image));

  at::Tensor mask = read_mask(file("masks/a.png"));
  ASSERT_EQ(mask.sizes(), (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(mask.sum().item<double>(), 6 * 8);  // a 0/1 mask: 1 is foreground
  write_mask(mask, file("written.png"));
  EXPECT_TRUE(read_mask(file("written.png")).equal(mask));
  cv::Mat grey = cv::imread(file("written.png"), cv::IMREAD_GRAYSCALE);
  EXPECT_EQ(grey.at<uchar>(0, 0), 255);
  EXPECT_EQ(grey.at<uchar>(0, 11), 0);

  EXPECT_NE(error_of([&] {
              read_image(file("images/none.png"), 4);
            }).find("cannot read \"" + file("images/none.png") + "\""),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              write_mask(mask, file("no/such/folder/m.png"));
            }).find("cannot write mask \"" + file("no/such/folder/m.png") + "\""),
            std::string::npos);
}

}  // namespace
}  // namespace ferry::data
