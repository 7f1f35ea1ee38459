#include "ferry/core/image_size.h"

#include <fmt/format.h>

#include <stdexcept>
#include <vector>

#include "ferry/core/text.h"

namespace ferry::core {
namespace {

int64_t side_of(const std::string& word, const std::string& text) {
  std::size_t used = 0;
  long long side = 0;
  try {
    side = std::stoll(word, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != word.size() || side < 1) {
    throw std::invalid_argument(fmt::format(
        "image size \"{}\": \"{}\" is not a positive whole number (give S, or H,W)", text, word));
  }
  return side;
}

}  // namespace

std::string ImageSize::text() const {
  return square() ? std::to_string(height) : fmt::format("{},{}", height, width);
}

std::string ImageSize::extent() const { return fmt::format("{} x {}", height, width); }

ImageSize ImageSize::parse(const std::string& text) {
  const std::vector<std::string> words = split(text, ',');
  if (words.size() == 1) return ImageSize(side_of(words[0], text));
  if (words.size() == 2) return ImageSize(side_of(words[0], text), side_of(words[1], text));
  throw std::invalid_argument(
      fmt::format("image size \"{}\": give one side S, or the height and width H,W", text));
}

}  // namespace ferry::core
