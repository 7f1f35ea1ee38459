// The precision a stage computes in (as Lightning's `precision` flag). Under BFloat16Mixed the
// stage's forward runs under autocast for its device (LibTorch's CPU autocast with bfloat16, or
// CUDA's), its parameters and their optimizer state stay float32, and its floating outputs leave
// it in bfloat16, so activations and their gradients travel between stages at half the bytes.
#pragma once

#include <string>

#include "ferry/core/enum_names.h"

namespace ferry::remote_module {

enum class Precision { Float32, BFloat16Mixed };

// "32" (or "32-true", as Lightning writes it), "bf16-mixed". Float16 is not among them: it needs
// a loss scaler Ferry does not have.
const core::EnumNames<Precision>& precision_names();
std::string precision_name(Precision precision);

}  // namespace ferry::remote_module
