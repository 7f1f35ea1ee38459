// Functions callable by name from other workers. No code travels over the wire: a caller names a
// function that the callee registered. Registration and lookup are safe from any thread.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/util/TypeTraits.h>
#include <fmt/format.h>

#include <functional>
#include <map>
#include <set>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ferry/rpc/error.h"
#include "ferry/rpc/rref.h"

namespace ferry::rpc {

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

// Raw form: arguments and result as IValues.
using RawFunction = std::function<c10::IValue(std::vector<c10::IValue>&)>;
// Async form: the handler returns a future and its pool thread is free at once, so a handler can
// wait on calls to other workers without holding a thread.
using AsyncFunction = std::function<FuturePtr(std::vector<c10::IValue>&)>;

class FunctionRegistry {
 public:
  // Each throws Error(InvalidArgument) if `name` is already registered.
  void add_raw(const std::string& name, RawFunction fn);
  void add_async(const std::string& name, AsyncFunction fn);
  // A handler that never blocks and returns within microseconds (bookkeeping: a counter, a table
  // entry). The agent runs it on the thread that read the request, saving the hand-off to a pool
  // thread and one wake-up per call; while it runs no connection of this process is read, so a
  // handler that waits, computes or frees much memory belongs in add_raw or add_async.
  void add_inline(const std::string& name, RawFunction fn);
  // Typed form: arguments and result convert to and from IValue, e.g.
  //   registry.add("add", [](at::Tensor a, at::Tensor b) { return a + b; });
  template <typename F>
  void add(const std::string& name, F fn);

  // The function's future; a bad call (arity, types) or a throwing function completes it with
  // an error. Throws Error(UnknownFunction) listing the registered names if there is none.
  FuturePtr invoke(const std::string& name, std::vector<c10::IValue>& args) const;
  bool contains(const std::string& name) const;
  // Whether `name` was registered with add_inline.
  bool runs_inline(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  mutable std::shared_mutex mutex_;
  std::map<std::string, AsyncFunction> functions_;
  std::set<std::string> inline_;
};

namespace detail {

std::string describe_type(const c10::IValue& value);

// Returns by value, so a parameter declared `const std::string&` binds to a living string.
template <typename T>
std::decay_t<T> from_ivalue(const std::string& function, size_t index, c10::IValue& value) {
  using D = std::decay_t<T>;
  auto mismatch = [&](const std::string& expected) {
    return Error(ErrorKind::InvalidArgument,
                 fmt::format("argument {} of \"{}\" must be {} but got {}", index, function,
                             expected, describe_type(value)));
  };
  if constexpr (std::is_same_v<D, c10::IValue>) {
    return std::move(value);
  } else if constexpr (std::is_same_v<D, RRefPtr>) {
    if (!value.isRRef()) throw mismatch("RRef");
    return to_rref(value);
  } else if constexpr (std::is_same_v<D, bool>) {
    if (!value.isBool()) throw mismatch("bool");
    return value.toBool();
  } else if constexpr (std::is_integral_v<D>) {
    if (!value.isInt()) throw mismatch("int");
    return static_cast<D>(value.toInt());
  } else if constexpr (std::is_floating_point_v<D>) {
    if (!value.isDouble() && !value.isInt()) throw mismatch("float");
    return static_cast<D>(value.isInt() ? static_cast<double>(value.toInt()) : value.toDouble());
  } else {
    auto expected = c10::getTypePtr<D>();
    if (!value.type()->isSubtypeOf(*expected)) throw mismatch(expected->str());
    return std::move(value).to<D>();
  }
}

template <typename F, size_t... I>
c10::IValue call_typed(F& fn, const std::string& name, std::vector<c10::IValue>& args,
                       std::index_sequence<I...>) {
  using Traits = c10::guts::infer_function_traits_t<F>;
  using Params = typename Traits::parameter_types;
  constexpr size_t kArity = sizeof...(I);
  if (args.size() != kArity) {
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("\"{}\" takes {} arguments but got {}", name, kArity, args.size()));
  }
  if constexpr (std::is_void_v<typename Traits::return_type>) {
    fn(from_ivalue<c10::guts::typelist::element_t<I, Params>>(name, I, args[I])...);
    return c10::IValue();
  } else {
    return c10::IValue(
        fn(from_ivalue<c10::guts::typelist::element_t<I, Params>>(name, I, args[I])...));
  }
}

}  // namespace detail

template <typename F>
void FunctionRegistry::add(const std::string& name, F fn) {
  using Traits = c10::guts::infer_function_traits_t<F>;
  add_raw(name, [name, fn = std::move(fn)](std::vector<c10::IValue>& args) mutable {
    return detail::call_typed(fn, name, args,
                              std::make_index_sequence<Traits::number_of_parameters>());
  });
}

}  // namespace ferry::rpc
