// Lookups take a shared lock so pool threads never wait on each other to find a function.
#include "ferry/rpc/registry.h"

#include <fmt/ranges.h>

#include <mutex>

namespace ferry::rpc {

namespace detail {

std::string describe_type(const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined()) return "an undefined Tensor";
    return fmt::format("Tensor of dtype {} and shape {}", c10::toString(t.scalar_type()),
                       c10::str(t.sizes()));
  }
  return value.type()->str();
}

}  // namespace detail

void FunctionRegistry::add_raw(const std::string& name, RawFunction fn) {
  add_async(name, [fn = std::move(fn)](std::vector<c10::IValue>& args) {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    try {
      future->markCompleted(fn(args));
    } catch (...) {
      future->setError(std::current_exception());
    }
    return future;
  });
}

void FunctionRegistry::add_inline(const std::string& name, RawFunction fn) {
  add_raw(name, std::move(fn));
  std::unique_lock<std::shared_mutex> lock(mutex_);
  inline_.insert(name);
}

bool FunctionRegistry::runs_inline(const std::string& name) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return inline_.count(name) > 0;
}

void FunctionRegistry::add_async(const std::string& name, AsyncFunction fn) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  if (!functions_.emplace(name, std::move(fn)).second) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("function \"{}\" is already registered", name));
  }
}

FuturePtr FunctionRegistry::invoke(const std::string& name, std::vector<c10::IValue>& args) const {
  AsyncFunction fn;
  {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = functions_.find(name);
    if (it == functions_.end()) {
      std::vector<std::string> known;
      // Ferry's own functions ("ferry.*") are not the user's to call by hand.
      for (const auto& entry : functions_) {
        if (entry.first.rfind("ferry.", 0) != 0) known.push_back(entry.first);
      }
      throw Error(ErrorKind::UnknownFunction,
                  fmt::format("no function \"{}\" is registered (registered: {})", name,
                              known.empty() ? std::string("none")
                                            : fmt::format("{}", fmt::join(known, ", "))));
    }
    fn = it->second;
  }
  try {
    return fn(args);
  } catch (...) {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
    future->setError(std::current_exception());
    return future;
  }
}

bool FunctionRegistry::contains(const std::string& name) const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  return functions_.count(name) > 0;
}

std::vector<std::string> FunctionRegistry::names() const {
  std::shared_lock<std::shared_mutex> lock(mutex_);
  std::vector<std::string> out;
  for (const auto& entry : functions_) out.push_back(entry.first);
  return out;
}

}  // namespace ferry::rpc
