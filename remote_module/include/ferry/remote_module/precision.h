// The precision a stage computes in (as Lightning's `precision` flag). Under BFloat16Mixed the
// stage's forward runs under autocast for its device (LibTorch's CPU autocast with bfloat16, or
// CUDA's), its parameters and their optimizer state stay float32, and its floating outputs leave
// it in bfloat16, so activations and their gradients travel between stages at half the bytes.
#pragma once

#include <string>

namespace ferry::remote_module {

enum class Precision { Float32, BFloat16Mixed };

// "32" or "32-true", "bf16-mixed"; throws std::invalid_argument naming the ones there are.
Precision parse_precision(const std::string& name);
const char* precision_name(Precision precision);

}  // namespace ferry::remote_module
