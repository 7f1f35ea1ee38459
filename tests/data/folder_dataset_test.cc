// The folder data set: files paired by name, resized or cropped, flipped with their masks, and
// every bad file an error that names it, also when it is read on a loader's thread.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <opencv2/imgcodecs.hpp>
#include <set>

#include "ferry/data/dataset.h"
#include "tests/support/error_of.h"
#include "tests/support/palette_png.h"

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
  options.augment = augment ? Augmentation::parse("flip") : Augmentation{};
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
  FolderDataset::Options stretched = sized(32);
  stretched.resize = Resize::stretch;
  FolderDataset set(dir(), stretched);
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

// A run resumed in the middle of an epoch sees the batches the unbroken run saw there: the same
// images in the same order, augmented the same way, whichever loader thread read them.
TEST_F(FolderData, AnEpochStartedAtABatchGivesTheBatchesOfTheWholeEpochFromThere) {
  for (int i = 0; i < 8; ++i) {
    write_pair(std::to_string(i) + ".png", std::to_string(i) + ".png", 48, 48, 4 * i + 3);
  }
  auto set = std::make_shared<FolderDataset>(dir(), sized(32, /*crop=*/true, /*augment=*/true));
  std::vector<std::size_t> all(8);
  std::iota(all.begin(), all.end(), 0);
  auto epoch_from = [&](std::size_t first_batch, int threads) {
    BatchLoader loader(set, all, 2, /*shuffle_seed=*/11, /*drop_last=*/true, threads);
    loader.start_epoch(3, first_batch);
    std::vector<Batch> batches;
    while (auto batch = loader.next()) batches.push_back(std::move(*batch));
    return batches;
  };
  const std::vector<Batch> whole = epoch_from(0, 3);
  ASSERT_EQ(whole.size(), 4u);
  const std::vector<Batch> again = epoch_from(0, 1);
  const std::vector<Batch> tail = epoch_from(2, 2);
  ASSERT_EQ(tail.size(), 2u);
  for (std::size_t b = 0; b < whole.size(); ++b) {
    EXPECT_TRUE(again[b].images.equal(whole[b].images)) << "batch " << b;
    EXPECT_TRUE(again[b].masks.equal(whole[b].masks)) << "batch " << b;
  }
  for (std::size_t b = 0; b < tail.size(); ++b) {
    EXPECT_TRUE(tail[b].images.equal(whole[b + 2].images)) << "batch " << b + 2;
    EXPECT_TRUE(tail[b].masks.equal(whole[b + 2].masks)) << "batch " << b + 2;
  }
  // Another epoch draws anew; an epoch started past its end gives nothing.
  BatchLoader loader(set, all, 2, 11, /*drop_last=*/true, 1);
  loader.start_epoch(4);
  std::optional<Batch> first = loader.next();
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(first->images.equal(whole[0].images));
  loader.start_epoch(3, 9);
  EXPECT_FALSE(loader.next().has_value());
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
  ImageFile image = read_image(file("images/a.png"), 4, Resize::pad);
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
  write_mask(mask.gt(0.5), file("from-bool.png"));  // as predict's threshold gives it
  EXPECT_EQ(cv::imread(file("from-bool.png"), cv::IMREAD_GRAYSCALE).at<uchar>(0, 0), 255);

  EXPECT_NE(error_of([&] {
              read_image(file("images/none.png"), 4, Resize::pad);
            }).find("cannot read \"" + file("images/none.png") + "\""),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              write_mask(mask, file("no/such/folder/m.png"));
            }).find("cannot write mask \"" + file("no/such/folder/m.png") + "\""),
            std::string::npos);
}

// Class ids 0 to 3 in four bands of `width` / 4 columns, with a row of `border` at the top.
cv::Mat bands(int width, int height, int type, int border) {
  cv::Mat ids(height, width, type, cv::Scalar(0));
  for (int k = 0; k < 4; ++k) ids(cv::Rect(k * width / 4, 0, width / 4, height)).setTo(k);
  ids.row(0).setTo(border);
  return ids;
}

TEST_F(FolderData, MasksOfClassIdsReadFromGreyLevelsOfEightAndSixteenBitsAndPalettes) {
  write_pair("a.png", "a.png", 16, 8, 0);
  write_pair("b.png", "b.png", 16, 8, 0);
  write_pair("c.png", "c.png", 16, 8, 0);
  ASSERT_TRUE(cv::imwrite(file("masks/a.png"), bands(16, 8, CV_8UC1, 255)));
  ASSERT_TRUE(cv::imwrite(file("masks/b.png"), bands(16, 8, CV_16UC1, 255)));
  const cv::Mat indices = bands(16, 8, CV_8UC1, 255);
  ferry::testing::write_palette_png(file("masks/c.png"), indices);
  FolderDataset::Options options = sized(16, /*crop=*/true);  // 16 x 8 cropped: as they are
  options.image_size = 8;
  options.labels = {4, 255};
  FolderDataset set(dir(), options);
  at::Tensor expected = torch::arange(4).repeat_interleave(4).expand({8, 16}).clone();
  expected[0].fill_(255);
  for (std::size_t i = 0; i < 3; ++i) {
    Sample s = set.get(i);
    EXPECT_EQ(s.mask.scalar_type(), at::kLong);
    EXPECT_TRUE(s.mask[0].equal(expected.slice(1, 4, 12))) << i << "\n" << s.mask;
  }
  // The same files read whole, as predict reads them.
  for (const char* name : {"a", "b", "c"}) {
    EXPECT_TRUE(read_mask(file("masks/" + std::string(name) + ".png"), {4, 255}).equal(expected))
        << name;
  }
}

TEST_F(FolderData, AMaskValueTheClassesDoNotAllowIsAnErrorNamingTheFileTheValueAndTheFlag) {
  write_pair("a.png", "a.png", 16, 8, 0);
  ASSERT_TRUE(cv::imwrite(file("masks/a.png"), bands(16, 8, CV_8UC1, 255)));
  FolderDataset::Options options = sized(16);
  options.labels = {4, std::nullopt};
  EXPECT_EQ(error_of([&] { FolderDataset(dir(), options).get(0); }),
            "mask \"" + file("masks/a.png") +
                "\" holds the value 255 at x 0, y 0, not a class id below --classes 4");
  options.labels = {3, 255};
  EXPECT_EQ(error_of([&] { FolderDataset(dir(), options).get(0); }),
            "mask \"" + file("masks/a.png") +
                "\" holds the value 3 at x 12, y 1, not a class id below --classes 3 nor the "
                "--ignore-index 255");
  // One class: 0/1 or 0/255, not both, not class ids.
  options.labels = {1, std::nullopt};
  EXPECT_NE(error_of([&] { FolderDataset(dir(), options).get(0); })
                .find("holds the value 2 at x 8, y 1: with --classes 1 a mask holds 0 and 1 (or 0 "
                      "and 255); masks of class ids need --classes K"),
            std::string::npos);
  cv::Mat both(8, 16, CV_8UC1, cv::Scalar(0));
  both.at<uchar>(2, 3) = 1;
  both.at<uchar>(5, 6) = 255;
  ASSERT_TRUE(cv::imwrite(file("masks/a.png"), both));
  EXPECT_NE(error_of([&] { FolderDataset(dir(), options).get(0); }).find("holds both 1 and 255"),
            std::string::npos);
  // With an ignore index, a binary mask is 0/1 and the ignored value stays.
  options.labels = {1, 255};
  at::Tensor read = read_mask(file("masks/a.png"), {1, 255});
  EXPECT_EQ(read.scalar_type(), at::kFloat);
  EXPECT_EQ(read[2][3].item<float>(), 1.0f);
  EXPECT_EQ(read[5][6].item<float>(), 255.0f);
  // Class ids cannot come from a colour image or a JPEG.
  ASSERT_TRUE(cv::imwrite(file("masks/a.png"), cv::Mat(8, 16, CV_8UC3, cv::Scalar(1, 1, 1))));
  options.labels = {4, std::nullopt};
  EXPECT_NE(error_of([&] { FolderDataset(dir(), options).get(0); }).find("is a colour image"),
            std::string::npos);
  fs::remove(file("masks/a.png"));
  ASSERT_TRUE(cv::imwrite(file("masks/a.jpg"), bands(16, 8, CV_8UC1, 0)));
  EXPECT_NE(error_of([&] { FolderDataset(dir(), options).get(0); }).find("is a JPEG"),
            std::string::npos);
}

// Every augmentation at once keeps the mask on the image's red (but along the band's edge, which
// resizing blends in the image and not in the mask); each draw is its own.
TEST_F(FolderData, RotationsScaledCropsAndColourMoveImageAndMaskTogether) {
  write_pair("wide.png", "wide.png", 64, 48, 20);
  FolderDataset::Options options = sized(32);
  options.augment = Augmentation::parse("flip,rot90,scale,color");
  FolderDataset augmented(dir(), options);
  bool saw_rows = false, saw_colour = false;
  std::set<float> red_shares;  // the whole image resized has one: 10 of 32 columns
  for (int draw = 0; draw < 40; ++draw) {
    Sample a = augmented.get(0);
    ASSERT_EQ(a.image.sizes(), (std::vector<int64_t>{3, 32, 32}));
    at::Tensor red = (a.image[0] > 0.5) & (a.image[2] < 0.5);
    EXPECT_LE(red.ne(a.mask[0] > 0.5).sum().item<int64_t>(), 32) << draw;
    // Turned a quarter, the red band runs along rows: a square of 24 pixels or more cannot lie
    // in the 20 red columns, so only then is a whole row red.
    saw_rows |= (a.mask[0].sum(1) == 32).any().item<bool>();
    red_shares.insert(a.mask.mean().item<float>());
    saw_colour |= std::abs(a.image.max().item<float>() - 1.0f) > 0.01f;
  }
  EXPECT_TRUE(saw_rows);
  EXPECT_GT(red_shares.size(), 3u);
  EXPECT_TRUE(saw_colour);
  EXPECT_NE(error_of([] {
              Augmentation::parse("flip,blur");
            }).find("--augment \"flip,blur\": \"blur\" is none of flip, rot90, scale, color"),
            std::string::npos);
  EXPECT_FALSE(Augmentation::parse("none").any());
}

TEST(BoxInFrame, PadFitsInsideCropCoversStretchFillsEachKeepingTheAspectButStretch) {
  const core::ImageSize square(32);
  // 40 wide and 30 high: a pad scales it to 32 x 24, centred; a crop to 43 x 32.
  const Box pad = box_in_frame(30, 40, square, Resize::pad);
  EXPECT_EQ((std::vector<int64_t>{pad.x, pad.y, pad.width, pad.height}),
            (std::vector<int64_t>{0, 4, 32, 24}));
  const Box crop = box_in_frame(30, 40, square, Resize::crop);
  EXPECT_EQ((std::vector<int64_t>{crop.x, crop.y, crop.width, crop.height}),
            (std::vector<int64_t>{-5, 0, 43, 32}));
  const Box stretch = box_in_frame(30, 40, square, Resize::stretch);
  EXPECT_EQ((std::vector<int64_t>{stretch.x, stretch.y, stretch.width, stretch.height}),
            (std::vector<int64_t>{0, 0, 32, 32}));
  // An image of the frame's aspect fills it whichever way.
  for (Resize r : {Resize::pad, Resize::crop, Resize::stretch}) {
    const Box b = box_in_frame(480, 640, core::ImageSize(192, 256), r);
    EXPECT_EQ((std::vector<int64_t>{b.x, b.y, b.width, b.height}),
              (std::vector<int64_t>{0, 0, 256, 192}))
        << resize_name(r);
    EXPECT_EQ(parse_resize(resize_name(r)), r);
  }
  EXPECT_NE(error_of([] { parse_resize("squash"); }).find("--resize \"squash\""),
            std::string::npos);
}

TEST_F(FolderData, APaddedImageKeepsItsAspectItsMaskFramedByTheIgnoreIndexACropTakesItsMiddle) {
  write_pair("a.png", "a.png", 40, 30, 20, /*on=*/1);
  FolderDataset::Options options = sized(32);
  options.labels = {3, 255};
  FolderDataset padded(dir(), options);
  Sample s = padded.get(0);
  ASSERT_EQ(s.mask.sizes(), (std::vector<int64_t>{1, 32, 32}));
  // Rows 0-3 and 28-31 are the frame: black, and ignored.
  EXPECT_TRUE(s.mask[0].slice(0, 0, 4).eq(255).all().item<bool>());
  EXPECT_TRUE(s.mask[0].slice(0, 28, 32).eq(255).all().item<bool>());
  EXPECT_EQ(s.image.slice(1, 0, 4).abs().sum().item<float>(), 0.0f);
  // Within, the red half is class 1, undistorted: 16 of 32 columns on every row.
  const at::Tensor inside = s.mask[0].slice(0, 4, 28);
  EXPECT_TRUE(inside.eq(1).sum(1).eq(16).all().item<bool>());
  EXPECT_TRUE(inside.slice(1, 16, 32).eq(0).all().item<bool>());

  options.resize = Resize::crop;
  Sample middle = FolderDataset(dir(), options).get(0);
  ASSERT_EQ(middle.mask.sizes(), (std::vector<int64_t>{1, 32, 32}));
  EXPECT_FALSE(middle.mask.eq(255).any().item<bool>());
  // Scaled to 43 x 32 (red in its first 21 or 22 columns), columns 5 to 36 kept.
  const int64_t red = middle.mask[0][0].eq(1).sum().item<int64_t>();
  EXPECT_GE(red, 16);
  EXPECT_LE(red, 17);
}

TEST_F(FolderData, ASizeThatIsNotSquareComesOutHeightByWidthAndTurnsOnlyByAHalf) {
  write_pair("a.png", "a.png", 64, 48, 16);
  FolderDataset::Options options = sized(0);
  options.image_size = core::ImageSize(24, 32);
  options.augment = Augmentation::parse("flip,rot90");
  FolderDataset set(dir(), options);
  for (int draw = 0; draw < 12; ++draw) {
    Sample s = set.get(0);
    ASSERT_EQ(s.image.sizes(), (std::vector<int64_t>{3, 24, 32}));
    ASSERT_EQ(s.mask.sizes(), (std::vector<int64_t>{1, 24, 32}));
    // The same aspect, so no frame: a quarter of the columns red, whole, whichever the turn.
    EXPECT_FLOAT_EQ(s.mask.mean().item<float>(), 0.25f) << draw;
    expect_mask_follows_red(s);
  }
  ImageFile file_read = read_image(file("images/a.png"), core::ImageSize(24, 32), Resize::pad);
  EXPECT_EQ(file_read.pixels.sizes(), (std::vector<int64_t>{3, 24, 32}));
  EXPECT_EQ((std::vector<int64_t>{file_read.box.x, file_read.box.y, file_read.box.width,
                                  file_read.box.height}),
            (std::vector<int64_t>{0, 0, 32, 24}));
}

TEST_F(FolderData, GreyAndRgbaImagesReadAsRgb) {
  write_pair("grey.png", "grey.png", 8, 8, 4);
  write_pair("rgba.png", "rgba.png", 8, 8, 4);
  ASSERT_TRUE(cv::imwrite(file("images/grey.png"), cv::Mat(8, 8, CV_8UC1, cv::Scalar(51))));
  ASSERT_TRUE(
      cv::imwrite(file("images/rgba.png"), cv::Mat(8, 8, CV_8UC4, cv::Scalar(255, 0, 0, 128))));
  FolderDataset set(dir(), sized(8));
  Sample grey = set.get(0), rgba = set.get(1);
  EXPECT_EQ(grey.image.sizes(), (std::vector<int64_t>{3, 8, 8}));
  EXPECT_TRUE(torch::allclose(grey.image, torch::full({3, 8, 8}, 0.2f)));
  EXPECT_FLOAT_EQ(rgba.image[2][0][0].item<float>(), 1.0f);  // BGR's blue is RGB's third
  EXPECT_FLOAT_EQ(rgba.image[0][0][0].item<float>(), 0.0f);
}

TEST(Synthetic, TheMultiClassSetDrawsAClassPerKindOfShapeDeterministically) {
  SyntheticDataset set(40, 32, 7, /*classes=*/4);
  at::Tensor seen = torch::zeros({4}, torch::kLong);
  for (std::size_t i = 0; i < set.size(); ++i) {
    Sample s = set.get(i);
    ASSERT_EQ(s.mask.scalar_type(), at::kLong);
    ASSERT_EQ(s.mask.sizes(), (std::vector<int64_t>{1, 32, 32}));
    seen += torch::bincount(s.mask.flatten(), {}, 4).gt(0).to(torch::kLong);
  }
  // Every class appears in many images, and none beyond the classes.
  EXPECT_GT(seen.min().item<int64_t>(), 5) << seen;
  EXPECT_TRUE(set.get(3).mask.equal(SyntheticDataset(40, 32, 7, 4).get(3).mask));
  EXPECT_TRUE(SyntheticDataset(40, 32, 7, 3).get(5).mask.max().item<int64_t>() <= 2);
  EXPECT_EQ(synthetic_class_names(3),
            (std::vector<std::string>{"background", "ellipse", "polygon"}));
  EXPECT_NE(error_of([] { SyntheticDataset(4, 32, 0, 5); }).find("--classes 5: the synthetic set"),
            std::string::npos);
}

TEST(Synthetic, ASizeThatIsNotSquareIsTheMiddleOfTheSquareOfItsLongerSide) {
  for (int64_t classes : {1, 3}) {
    const Sample wide = SyntheticDataset(4, core::ImageSize(32, 64), 5, classes).get(2);
    const Sample square = SyntheticDataset(4, 64, 5, classes).get(2);
    ASSERT_EQ(wide.image.sizes(), (std::vector<int64_t>{3, 32, 64}));
    ASSERT_EQ(wide.mask.sizes(), (std::vector<int64_t>{1, 32, 64}));
    EXPECT_TRUE(wide.image.equal(square.image.slice(1, 16, 48)));
    EXPECT_TRUE(wide.mask.equal(square.mask.slice(1, 16, 48)));
  }
}

// A mask of class ids writes as grey levels and reads back the same, of 8 or 16 bits.
TEST_F(FolderData, MasksOfClassIdsWriteBack) {
  at::Tensor ids = torch::arange(4).repeat_interleave(3).expand({5, 12}).clone();
  write_mask(ids, file("ids.png"));
  EXPECT_TRUE(read_mask(file("ids.png"), {4, std::nullopt}).equal(ids));
  ids[0][0] = 300;
  write_mask(ids, file("wide.png"));
  EXPECT_EQ(cv::imread(file("wide.png"), cv::IMREAD_UNCHANGED).depth(), CV_16U);
  EXPECT_TRUE(read_mask(file("wide.png"), {301, std::nullopt}).equal(ids));
}

// An overlay halves each pixel of a class with the class's colour; the background stays.
TEST_F(FolderData, AnOverlayColoursEachClassOverTheImage) {
  write_pair("a.png", "a.png", 8, 4, 0);  // all blue
  at::Tensor ids = torch::zeros({4, 8}, torch::kLong);
  ids[1][2] = 1;  // VOC's dark red
  ids[2][3] = 2;  // VOC's dark green
  write_overlay(file("images/a.png"), ids, file("overlay.png"));
  cv::Mat out = cv::imread(file("overlay.png"), cv::IMREAD_COLOR);
  EXPECT_EQ(out.at<cv::Vec3b>(0, 0), cv::Vec3b(255, 0, 0));
  EXPECT_EQ(out.at<cv::Vec3b>(1, 2), cv::Vec3b(127, 0, 64));
  EXPECT_EQ(out.at<cv::Vec3b>(2, 3), cv::Vec3b(127, 64, 0));
  EXPECT_NE(error_of([&] {
              write_overlay(file("images/a.png"), ids.t(), file("o.png"));
            }).find("the mask is 4x8, its image"),
            std::string::npos);
}

TEST(Normalization, ImagesLessTheMeanOverTheDeviationAsNamedOrGivenAndItsTextReadsBack) {
  const Normalization imagenet = Normalization::parse("imagenet");
  EXPECT_EQ(imagenet.to_string(), "0.485,0.456,0.406/0.229,0.224,0.225");
  EXPECT_EQ(Normalization::parse(imagenet.to_string()), imagenet);
  at::Tensor image = torch::rand({3, 4, 5});
  at::Tensor expected = (image - torch::tensor({0.485f, 0.456f, 0.406f}).view({3, 1, 1})) /
                        torch::tensor({0.229f, 0.224f, 0.225f}).view({3, 1, 1});
  EXPECT_TRUE(torch::allclose(imagenet.apply(image), expected));
  EXPECT_TRUE(torch::allclose(imagenet.apply(image.unsqueeze(0))[0], expected));  // a batch
  EXPECT_TRUE(Normalization::parse("none").apply(image).equal(image));
  EXPECT_EQ(Normalization::parse("0.5,0.5,0.5/0.25,0.25,0.25")
                .apply(torch::ones({3, 1, 1}))
                .flatten()[0]
                .item<float>(),
            2.0f);
  for (const char* bad : {"imagenet1k", "0.5,0.5/1,1,1", "0.5,0.5,0.5/1,1,x", "1,1,1/1,0,1"}) {
    EXPECT_NE(error_of([&] {
                Normalization::parse(bad);
              }).find("--normalize \"" + std::string(bad) + "\""),
              std::string::npos)
        << bad;
  }
  // A data set's images normalised, its masks as they were.
  auto set = std::make_shared<SyntheticDataset>(2, 32, 1);
  auto seen = normalized(set, imagenet);
  EXPECT_TRUE(torch::allclose(seen->get(1).image, imagenet.apply(set->get(1).image)));
  EXPECT_TRUE(seen->get(1).mask.equal(set->get(1).mask));
  EXPECT_EQ(normalized(set, Normalization{}), set);
}

}  // namespace
}  // namespace ferry::data
