// Calls to many workers at once, waited for together, their failures told as one Error: how a
// caller has every owner of something act (an optimizer's owners, a pipeline's stages, the
// replicas of a batch norm).
#pragma once

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <string>
#include <vector>

#include "ferry/rpc/error.h"

namespace ferry::rpc {

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

// Completes with None once every one of `futures` has completed, failed or not; the caller looks
// at each. Completes at once for none. Holds no thread while it waits.
FuturePtr when_all(const std::vector<FuturePtr>& futures);

// The calls of one fan-out. A resource of the thread that makes it: call and wait from one
// thread, any but the agent's loop thread.
class FanOut {
 public:
  // Starts `function(args)` on `worker` through the default agent. `label` names the call in an
  // error ("pipeline stage 1 (\"decoder\") on worker \"b\""); empty: on worker "<worker>".
  void call(const std::string& worker, const std::string& function, std::vector<c10::IValue> args,
            std::string label = "");
  // A call already started elsewhere, to `worker`.
  void add(FuturePtr future, std::string worker, std::string label = "");
  std::size_t size() const { return futures_.size(); }

  // Waits for every call and returns their values in call order. If any failed, throws one Error
  // naming each failure, "<what> failed <label>: <reason>; <label>: <reason>" ("<label>:
  // <reason>; ..." where `what` is empty), the reason being the worker's own words where it raised
  // the error. Its kind and worker are those of first_failure's pick (a lost worker before any
  // other failure); the worker is the one called where the failure names none.
  std::vector<c10::IValue> wait(const std::string& what = "") const;

 private:
  std::vector<FuturePtr> futures_;
  std::vector<std::string> workers_;
  std::vector<std::string> labels_;
};

}  // namespace ferry::rpc
