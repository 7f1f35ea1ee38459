// Copying tensors into a module by name, as weights saved elsewhere (a stage's state dict, a file
// written by Python) arrive.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace ferry::models {

// What a load found. Value type.
struct LoadReport {
  std::vector<std::string> missing;     // in the module (under the prefix), not in the state
  std::vector<std::string> unexpected;  // in the state, not in the module
  std::vector<std::string> mismatched;  // in both, shapes differ ("name: [a, b] vs [c, d]")
  int64_t loaded = 0;                   // tensors copied in
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  std::string describe() const;
};

// Copies each tensor of `state` into the parameter or buffer of `module` named `prefix` + its
// name. Tensors with mismatched shapes are left alone and reported.
LoadReport load_state_dict(torch::nn::Module& module,
                           const c10::Dict<std::string, at::Tensor>& state,
                           const std::string& prefix = "");

// The tensors of a weights file, by name: a state dict saved by Python's
// `torch.save(model.state_dict())` (or a checkpoint dict holding one under "state_dict"), or a
// TorchScript archive (its parameters and buffers). Throws std::invalid_argument naming
// the file and what was wrong with it.
c10::Dict<std::string, at::Tensor> read_weights(const std::string& path);

// read_weights, then load_state_dict. Names in the file are relative to `prefix`.
LoadReport load_weights(torch::nn::Module& module, const std::string& path,
                        const std::string& prefix = "");

}  // namespace ferry::models
