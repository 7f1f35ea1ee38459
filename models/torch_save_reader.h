// Reads the tensors of a file written by Python's torch.save (the zip format, pickle protocol 2
// to 5) without Python. LibTorch's own unpickler turns the OrderedDict of a state dict into None,
// so a state dict saved from Python cannot be read with torch::pickle_load; this reader knows
// the few Python objects a saved state dict is made of (dicts, tuples, lists, numbers, strings,
// tensors rebuilt from storages, OrderedDict) and keeps anything else as an opaque object.
#pragma once

#include <ATen/core/Tensor.h>
#include <caffe2/serialize/inline_container.h>

#include <map>
#include <string>

namespace ferry::models {

// The dict at the top of the pickle (or under "state_dict"), its tensor values by name. Throws
// std::runtime_error saying what is wrong with the file; non-tensor values are reported by name.
std::map<std::string, at::Tensor> read_torch_save(caffe2::serialize::PyTorchStreamReader& archive);

}  // namespace ferry::models
