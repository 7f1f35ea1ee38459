// Image sizes in the JSON the trainer writes and reads (reports, plans, cost caches): a square as
// its side, as before sizes could be other than square; otherwise [height, width].
#pragma once

#include <nlohmann/json.hpp>

#include "ferry/core/image_size.h"

namespace nlohmann {

template <>
struct adl_serializer<ferry::core::ImageSize> {
  template <typename Json>
  static void to_json(Json& j, const ferry::core::ImageSize& size) {
    if (size.square()) {
      j = size.height;
    } else {
      j = Json::array({size.height, size.width});
    }
  }
  template <typename Json>
  static void from_json(const Json& j, ferry::core::ImageSize& size) {
    if (j.is_array()) {
      size = {j.at(0).template get<int64_t>(), j.at(1).template get<int64_t>()};
    } else {
      size = ferry::core::ImageSize(j.template get<int64_t>());
    }
  }
};

}  // namespace nlohmann
