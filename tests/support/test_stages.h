// Stage types the remote-module tests build on workers, also buildable locally for comparison.
#pragma once

#include <memory>

#include "ferry/remote_module/stage.h"

namespace ferry::testing {

// "test.mlp": Linear(in, hidden) - ReLU - Dropout(dropout) - Linear(hidden, out), initialised
// from `seed`; one tensor in, one out.
// "test.pyramid": Conv2d(channels, channels, 3) - BatchNorm2d, then a list of the features at
// full, half and quarter size.
// And the loss "test.mse": torch::mse_loss(output, target).
void register_test_stages();

// A "test.mlp" configuration without dropout.
remote_module::StageConfig mlp_config(int64_t in, int64_t hidden, int64_t out, int64_t seed);

// A stage built here, as a worker would build it, holding `state` (from RemoteModule::state_dict)
// so that a test can compare a remote stage with a local one.
std::unique_ptr<remote_module::Stage> make_local_stage(
    const std::string& type, const remote_module::StageConfig& config,
    const c10::Dict<std::string, at::Tensor>& state);

}  // namespace ferry::testing
