// Optimizer types by name, for the worker that builds a parameter owner's optimizer.
#pragma once

#include <string>

#include "ferry/dist_autograd/optimizer.h"

namespace ferry::dist_autograd {

// The factory registered as `name`; Error(InvalidArgument) listing the known names otherwise.
OptimizerFactory factory_of(const std::string& name);

}  // namespace ferry::dist_autograd
