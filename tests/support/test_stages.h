// Stage types the remote-module tests build on workers, also buildable locally for comparison.
#pragma once

#include <memory>

#include "ferry/remote_module/stage.h"

namespace ferry::testing {

// "test.mlp": Linear(in, hidden) - ReLU - Dropout(dropout) - Linear(hidden, out), initialised
// from `seed`; one tensor in, one out.
// "test.pyramid": Conv2d(channels, channels, 3) - BatchNorm2d, then a list of the features at
// full, half and quarter size.
void register_test_stages();

}  // namespace ferry::testing
