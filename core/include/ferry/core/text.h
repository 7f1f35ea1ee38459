// Lists as flags and files write them ("flip,rot90", "ce;ignore_index=255"). No LibTorch. Safe
// from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ferry::core {

// The parts of `text` between `separator`s, empty ones kept: "a,,b" is {"a", "", "b"}, and "" is
// {""}.
std::vector<std::string> split(std::string_view text, char separator);

}  // namespace ferry::core
