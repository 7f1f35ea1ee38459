#include "tests/support/palette_png.h"

#include <png.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <vector>

namespace ferry::testing {

void write_palette_png(const std::string& path, const cv::Mat& ids) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "wb"), std::fclose);
  if (!file) throw std::runtime_error("cannot write \"" + path + "\"");
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw std::runtime_error("libpng cannot write \"" + path + "\"");
  }
  png_init_io(png, file.get());
  png_set_IHDR(png, info, static_cast<png_uint_32>(ids.cols), static_cast<png_uint_32>(ids.rows), 8,
               PNG_COLOR_TYPE_PALETTE, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_color> palette(256);
  for (int k = 0; k < 256; ++k) {
    palette[static_cast<std::size_t>(k)] = {static_cast<png_byte>(255 - k), 128,
                                            static_cast<png_byte>(40 * k % 256)};
  }
  png_set_PLTE(png, info, palette.data(), 256);
  png_write_info(png, info);
  for (int y = 0; y < ids.rows; ++y) {
    png_write_row(png, const_cast<png_bytep>(ids.ptr<png_byte>(y)));
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
}

}  // namespace ferry::testing
