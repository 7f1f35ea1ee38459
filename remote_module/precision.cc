#include "ferry/remote_module/precision.h"

#include <fmt/format.h>

#include <stdexcept>

namespace ferry::remote_module {

Precision parse_precision(const std::string& name) {
  if (name == "32" || name == "32-true") return Precision::Float32;
  if (name == "bf16-mixed") return Precision::BFloat16Mixed;
  throw std::invalid_argument(fmt::format(
      "precision \"{}\" is neither 32 (or 32-true) nor bf16-mixed; float16 needs a loss scaler "
      "Ferry does not have",
      name));
}

const char* precision_name(Precision precision) {
  return precision == Precision::BFloat16Mixed ? "bf16-mixed" : "32";
}

}  // namespace ferry::remote_module
