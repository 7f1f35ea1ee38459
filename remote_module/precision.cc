#include "ferry/remote_module/precision.h"

namespace ferry::remote_module {

const core::EnumNames<Precision>& precision_names() {
  static const core::EnumNames<Precision> names = {{Precision::Float32, "32"},
                                                   {Precision::Float32, "32-true"},
                                                   {Precision::BFloat16Mixed, "bf16-mixed"}};
  return names;
}

std::string precision_name(Precision precision) {
  return core::name_of(precision_names(), precision);
}

}  // namespace ferry::remote_module
