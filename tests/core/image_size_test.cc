// Image sizes as `--image-size` reads them: one side for a square, or the height and width.
#include "ferry/core/image_size.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

namespace ferry::core {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(ImageSize, ReadsASideAsASquareAndTwoAsHeightThenWidth) {
  EXPECT_EQ(ImageSize::parse("256"), ImageSize(256, 256));
  const ImageSize wide = ImageSize::parse("192,320");
  EXPECT_EQ(wide.height, 192);
  EXPECT_EQ(wide.width, 320);
  EXPECT_FALSE(wide.square());
  EXPECT_EQ(wide.pixels(), 192 * 320);
  EXPECT_EQ(wide.text(), "192,320");
  EXPECT_EQ(ImageSize(64).text(), "64");
  EXPECT_EQ(ImageSize::parse(wide.text()), wide);
}

TEST(ImageSize, RefusesWhatIsNoSizeQuotingIt) {
  for (const char* bad : {"", "0", "-32", "64x64", "64,", ",64", "64,64,64", "6 4", "big"}) {
    EXPECT_THAT([&] { ImageSize::parse(bad); },
                ThrowsMessage<std::invalid_argument>(HasSubstr(std::string("\"") + bad + "\"")))
        << bad;
  }
}

}  // namespace
}  // namespace ferry::core
