// What install() puts in place, one piece per source file. Internal to dist_autograd/.
#pragma once

#include <memory>

#include "ferry/rpc/grad_observer.h"
#include "ferry/rpc/registry.h"

namespace ferry::dist_autograd {

std::shared_ptr<rpc::GradObserver> make_grad_observer();     // recording.cc
void install_backward_functions(rpc::FunctionRegistry& r);   // backward.cc
void install_optimizer_functions(rpc::FunctionRegistry& r);  // local_optimizer.cc

}  // namespace ferry::dist_autograd
