// How far a result computed elsewhere (split across workers, loaded from a file) is from the
// reference: the largest absolute difference over the reference's largest magnitude.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace ferry::models {

inline double max_relative_error(const at::Tensor& got, const at::Tensor& want) {
  double scale = std::max(want.abs().max().item<double>(), 1e-12);
  return (got - want).abs().max().item<double>() / scale;
}

// The worst over pairs; an undefined tensor in `got` is an error, not a zero.
inline double max_relative_error(const std::vector<at::Tensor>& got,
                                 const std::vector<at::Tensor>& want) {
  if (got.size() != want.size()) throw std::invalid_argument("max_relative_error: sizes differ");
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!got[i].defined()) throw std::invalid_argument("max_relative_error: undefined tensor");
    worst = std::max(worst, max_relative_error(got[i], want[i]));
  }
  return worst;
}

}  // namespace ferry::models
