// Recording: the observer rpc/ calls for every message sent or received inside a context. A
// message with tensors requiring grad leaves a send function (their gradient edges) on the
// sender and a RecvBackward as the grad_fn of the received tensors, both keyed by the message
// id the tag carries. A request inside a context is tagged even without such tensors, so the
// callee knows the context its result (which may require grad through its parameters) belongs to.
#include <fmt/format.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>

#include "dist_autograd/context_store.h"
#include "dist_autograd/install.h"
#include "dist_autograd/recv_backward.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"

namespace ferry::dist_autograd {
namespace {

// The tensors of `value` that require grad, in the order the wire carries them. Both ends walk
// the same value, so the i-th tensor here is the i-th there.
void collect(const c10::IValue& value, std::vector<at::Tensor>* out) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (t.defined() && t.requires_grad()) out->push_back(t);
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorList().vec()) {
      if (t.defined() && t.requires_grad()) out->push_back(t);
    }
  } else if (value.isIntList() || value.isDoubleList() || value.isBoolList()) {
    return;
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) collect(item, out);
  } else if (value.isTuple()) {
    for (const c10::IValue& item : value.toTupleRef().elements()) collect(item, out);
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      collect(entry.key(), out);
      collect(entry.value(), out);
    }
  }
}

std::vector<at::Tensor> tensors_requiring_grad(const c10::IValue& value) {
  std::vector<at::Tensor> out;
  collect(value, &out);
  return out;
}

// Records the send function of a message to `to_rank`; returns its tag.
rpc::GradTag record_send(ContextState& context, const std::vector<at::Tensor>& tensors,
                         int to_rank) {
  rpc::GradTag tag{context.id(), next_id()};
  context.add_worker(to_rank);
  if (tensors.empty()) return tag;
  SendFunction send;
  send.to_rank = to_rank;
  send.edges.reserve(tensors.size());
  for (const at::Tensor& t : tensors) send.edges.push_back(torch::autograd::impl::gradient_edge(t));
  context.add_send(tag.message_id, std::move(send));
  return tag;
}

class Observer final : public rpc::GradObserver {
 public:
  rpc::GradTag on_send_request(const std::string& function, const c10::IValue& args,
                               int to_rank) override {
    std::int64_t id = current_id();
    // Backward, release and the optimizer never join the graph.
    if (id == 0 || function.rfind("ferry.autograd.", 0) == 0 ||
        function.rfind("ferry.optim.", 0) == 0) {
      return {};
    }
    ContextPtr context = find_context(id);
    if (!context) return {};
    return record_send(*context, tensors_requiring_grad(args), to_rank);
  }

  rpc::GradTag on_send_response(const rpc::GradTag& request, const c10::IValue& result,
                                int to_rank) override {
    std::vector<at::Tensor> tensors = tensors_requiring_grad(result);
    if (tensors.empty()) return {};
    ContextPtr context = find_context(request.context_id);
    if (!context) return {};
    return record_send(*context, tensors, to_rank);
  }

  void on_receive(const rpc::GradTag& tag, const c10::IValue& value, int from_rank) override {
    ContextPtr context = join_context(tag.context_id);
    if (!context) return;
    context->add_worker(from_rank);
    std::vector<at::Tensor> tensors = tensors_requiring_grad(value);
    if (tensors.empty()) return;
    auto recv = std::make_shared<RecvBackward>(tag.context_id, tag.message_id, from_rank);
    for (at::Tensor& t : tensors) torch::autograd::set_history(t, recv);
  }

  std::shared_ptr<void> enter(const rpc::GradTag& tag) override {
    std::int64_t previous = current_id();
    set_current_id(tag.context_id);
    return std::shared_ptr<void>(nullptr, [previous](void*) { set_current_id(previous); });
  }

  rpc::GradTag current() override { return {current_id(), 0}; }
};

}  // namespace

torch::autograd::variable_list RecvBackward::apply(torch::autograd::variable_list&&) {
  throw rpc::Error(
      rpc::ErrorKind::InvalidArgument,
      fmt::format("a local backward() reached a tensor that arrived from worker \"{}\" inside "
                  "autograd context {}; run ferry::dist_autograd::backward() on that context",
                  rpc::workers().at(from_rank_).name, context_id_));
}

std::shared_ptr<rpc::GradObserver> make_grad_observer() { return std::make_shared<Observer>(); }

}  // namespace ferry::dist_autograd
