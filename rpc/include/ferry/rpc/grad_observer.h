// The seam between rpc/ and distributed autograd. rpc/ knows nothing of autograd graphs: it only
// asks an observer, installed once per process by the layer above, which tag a message gets, and
// tells it when a tagged message arrives. The tag travels in the envelope; rpc/ never reads it.
//
// Thread rules: the observer may be called from any thread, concurrently, and must not block on
// the network (on_receive of a response runs on the agent's loop thread).
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <string>

namespace ferry::rpc {

// Which autograd context a message belongs to and which send/recv pair it stitches. Value type;
// zero ids mean "no tag".
struct GradTag {
  std::int64_t context_id = 0;
  std::int64_t message_id = 0;
  bool valid() const { return context_id != 0; }
};

class GradObserver {
 public:
  virtual ~GradObserver() = default;
  // On the calling thread, before a request to `to_rank` is encoded: its tag, or an invalid tag
  // to send it plain.
  virtual GradTag on_send_request(const std::string& function, const c10::IValue& args,
                                  int to_rank) = 0;
  // On the thread that completes the handler of tagged `request`: the tag of its response.
  virtual GradTag on_send_response(const GradTag& request, const c10::IValue& result,
                                   int to_rank) = 0;
  // Before the handler of a tagged request runs (pool thread), or before the future of a call
  // whose response is tagged completes (loop thread). May change `value`'s tensors' history.
  virtual void on_receive(const GradTag& tag, const c10::IValue& value, int from_rank) = 0;
  // Makes `tag`'s context current on this thread while a tagged request's handler runs; the
  // returned guard restores the previous state when destroyed.
  virtual std::shared_ptr<void> enter(const GradTag& tag) = 0;
  // The context current on this thread (message id 0), so that work handed to another thread
  // can enter it there.
  virtual GradTag current() = 0;
};

// Installs the process's observer (kept for the life of the process). Later calls replace it.
void set_grad_observer(std::shared_ptr<GradObserver> observer);
// The installed observer, or nullptr.
GradObserver* grad_observer();

}  // namespace ferry::rpc
