// Each process keeps a mailbox of what it offers: a producer's portal elements, which their
// consumers take during their forward, and a consumer's portal gradients, which their producers
// take during their backward ("ferry.portal.take", on a pool thread). Nothing is pushed: a tensor
// stays where it lives anyway (the producer's graph keeps its skip; the consumer has just computed
// the gradient) until the stage that needs it asks, and whatever a stage asks for was offered
// before the message that set it running was sent.
#include "ferry/remote_module/portal.h"

#include <fmt/format.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <tuple>

#include "ferry/remote_module/portal_flow.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "remote_module/installers.h"

namespace ferry::remote_module {
namespace {

using rpc::Error;
using rpc::ErrorKind;

// (flow, micro-batch, producing stage, element of its output, whether it is the gradient)
using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool>;

struct Letter {
  at::Tensor tensor;
  bool requires_grad = false;
  std::chrono::steady_clock::time_point offered;
};

std::mutex mailbox_mutex;
std::map<Key, Letter> mailbox;

// A flow that failed half-way leaves letters nobody takes: they go once they are older than any
// call of the flow could be.
void drop_stale(std::chrono::steady_clock::time_point now) {
  const auto bound = 2 * rpc::agent().options().rpc_timeout;
  for (auto it = mailbox.begin(); it != mailbox.end();) {
    it = now - it->second.offered > bound ? mailbox.erase(it) : std::next(it);
  }
}

std::string what_of(const Key& key) {
  const auto& [flow, microbatch, stage, element, gradient] = key;
  std::string pass = microbatch < 0 ? fmt::format("pass {}", flow)
                                    : fmt::format("micro-batch {} of step {}", microbatch, flow);
  return fmt::format("{} of output element {} of stage {} ({})",
                     gradient ? "the gradient" : "the value", element, stage, pass);
}

void offer(const Key& key, at::Tensor tensor, bool requires_grad) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mailbox_mutex);
  drop_stale(now);
  mailbox[key] = {std::move(tensor), requires_grad, now};
}

Letter take_here(const Key& key) {
  std::lock_guard<std::mutex> lock(mailbox_mutex);
  auto it = mailbox.find(key);
  if (it == mailbox.end()) {
    throw Error(ErrorKind::RemoteException,
                fmt::format("worker \"{}\" holds no {}", rpc::self().name, what_of(key)));
  }
  Letter letter = std::move(it->second);
  mailbox.erase(it);
  return letter;
}

// Takes `key` from `worker`'s mailbox, for `taker` ("stage 3's forward").
Letter take_from(const std::string& worker, const Key& key, const std::string& taker) {
  const auto& [flow, microbatch, stage, element, gradient] = key;
  try {
    c10::IValue got =
        rpc::rpc_sync(worker, "ferry.portal.take", {flow, microbatch, stage, element, gradient});
    const auto& items = got.toTupleRef().elements();
    return {items.at(0).toTensor(), items.at(1).toBool(), {}};
  } catch (const Error& e) {
    throw e.restated(fmt::format("{} could not take {} from worker \"{}\": {}", taker, what_of(key),
                                 worker, e.cause().empty() ? e.what() : e.cause()));
  }
}

// The grad_fn of a portal element on its consumer: it offers the element's gradient to the
// producer. It holds no tensor, so the element is freed once the consumer's graph no longer needs
// it (an autograd leaf would keep it until backward). Its one next edge goes to `anchor`, a leaf
// of no elements, because a backward asked only for gradients at leaves runs just the nodes on
// the way to one.
class PortalExit final : public torch::autograd::Node {
 public:
  PortalExit(Key key, const at::Tensor& element)
      : key_(std::move(key)), sizes_(element.sizes().vec()), dtype_(element.scalar_type()) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    // Its producer asks for a gradient in any case: none here is a zero one.
    offer(key_, grads[0].defined() ? grads[0] : at::zeros(sizes_, dtype_), false);
    return {at::Tensor()};
  }
  std::string name() const override { return "ferry::PortalExit"; }

 private:
  Key key_;
  std::vector<int64_t> sizes_;
  at::ScalarType dtype_;
};

// Identity on `main` for the producer; its backward takes the gradient of `portal` from its
// consumer and adds it to the graph.
struct PortalJoin : torch::autograd::Function<PortalJoin> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& main,
                            const at::Tensor& /*portal*/, const std::string& consumer_worker,
                            int64_t flow, int64_t microbatch, int64_t stage, int64_t element) {
    ctx->saved_data["worker"] = consumer_worker;
    ctx->saved_data["key"] = std::vector<int64_t>{flow, microbatch, stage, element};
    return main;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    std::vector<int64_t> k = ctx->saved_data["key"].toIntVector();
    Letter letter =
        take_from(ctx->saved_data["worker"].toStringRef(), {k[0], k[1], k[2], k[3], true},
                  fmt::format("stage {}'s backward", k[2]));
    return {grads[0],     letter.tensor, at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(),  at::Tensor()};
  }
};

// The tensors of stage `index`'s output list, as many as its routes place.
std::vector<at::Tensor> output_tensors(const Routes& routes, int64_t index,
                                       const c10::IValue& output) {
  const auto& hops = routes.at(static_cast<size_t>(index));
  if (!output.isTensorList() || output.toTensorList().size() != hops.size()) {
    rpc::refuse(fmt::format(
        "stage {} returned {}, but its routes place a list of {} tensors", index,
        output.isTensorList() ? fmt::format("a list of {} tensors", output.toTensorList().size())
                              : output.tagKind(),
        hops.size()));
  }
  return output.toTensorVector();
}

c10::impl::GenericList int_list(const std::vector<int64_t>& values) {
  c10::impl::GenericList out(c10::IntType::get());
  for (int64_t v : values) out.push_back(v);
  return out;
}

}  // namespace

void check_routes(const Routes& routes, size_t stages) {
  if (routes.empty()) return;
  if (routes.size() != stages) {
    rpc::refuse(
        fmt::format("routes are given for {} stages of a chain of {}", routes.size(), stages));
  }
  if (!routes.back().empty())
    rpc::refuse("the last stage's output is the chain's: it has no routes");
  std::vector<std::vector<int>> filled(stages);
  for (size_t s = 0; s < stages; ++s) {
    filled[s].assign(static_cast<size_t>(routed_input_size(routes, static_cast<int64_t>(s))), 0);
  }
  for (size_t s = 0; s + 1 < stages; ++s) {
    for (size_t q = 0; q < routes[s].size(); ++q) {
      const Hop& hop = routes[s][q];
      if (hop.stage <= static_cast<int64_t>(s) || hop.stage >= static_cast<int64_t>(stages)) {
        rpc::refuse(
            fmt::format("element {} of stage {}'s output is routed to stage {}: it must go to a "
                        "later stage of the {}",
                        q, s, hop.stage, stages));
      }
      auto& slots = filled[static_cast<size_t>(hop.stage)];
      if (hop.position < 0 || hop.position >= static_cast<int64_t>(slots.size()) ||
          slots[static_cast<size_t>(hop.position)]++ > 0) {
        rpc::refuse(
            fmt::format("element {} of stage {}'s output is routed to position {} of stage {}'s "
                        "input, which has {} positions, each filled once",
                        q, s, hop.position, hop.stage, slots.size()));
      }
    }
  }
}

int64_t routed_input_size(const Routes& routes, int64_t stage) {
  int64_t n = 0;
  for (int64_t s = 0; s < stage && s < static_cast<int64_t>(routes.size()); ++s) {
    for (const Hop& hop : routes[static_cast<size_t>(s)]) n += hop.stage == stage ? 1 : 0;
  }
  return n;
}

c10::IValue routes_to_ivalue(const Routes& routes) {
  c10::impl::GenericList out(c10::ListType::ofInts());
  for (const auto& stage : routes) {
    std::vector<int64_t> flat;
    for (const Hop& hop : stage) flat.insert(flat.end(), {hop.stage, hop.position});
    out.push_back(int_list(flat));
  }
  return out;
}

Routes routes_from_ivalue(const c10::IValue& value) {
  if (!value.isList()) rpc::refuse("routes must be a list of int lists");
  Routes routes;
  for (const c10::IValue& stage : value.toListRef()) {
    if (!stage.isIntList() || stage.toIntList().size() % 2 != 0) {
      rpc::refuse("each stage's routes must be a list of (stage, position) ints");
    }
    std::vector<int64_t> flat = stage.toIntVector();
    std::vector<Hop> hops;
    for (size_t i = 0; i < flat.size(); i += 2) hops.push_back({flat[i], flat[i + 1]});
    routes.push_back(std::move(hops));
  }
  return routes;
}

int64_t new_flow_id() {
  static std::atomic<int64_t> counter{0};
  return (static_cast<int64_t>(rpc::self().rank + 1) << 40) | ++counter;
}

Gathered gather_portals(const Routes& routes, const std::vector<std::string>& workers,
                        int64_t index, const Flow& flow, const c10::IValue& from_before) {
  if (!from_before.isTuple() || from_before.toTupleRef().elements().size() != 1 ||
      !from_before.toTupleRef().elements()[0].isTensorList()) {
    rpc::refuse(fmt::format("stage {} of a routed chain takes one list of tensors", index));
  }
  const std::vector<at::Tensor> main = from_before.toTupleRef().elements()[0].toTensorVector();
  std::vector<at::Tensor> inputs(static_cast<size_t>(routed_input_size(routes, index)));
  Gathered out;
  const std::string stage_name = fmt::format("stage {}", index);
  size_t next_main = 0;
  for (int64_t s = 0; s < index; ++s) {
    const auto& hops = routes[static_cast<size_t>(s)];
    for (size_t q = 0; q < hops.size(); ++q) {
      if (hops[q].stage != index) continue;
      at::Tensor& slot = inputs[static_cast<size_t>(hops[q].position)];
      if (s + 1 == index) {
        if (next_main == main.size()) {
          rpc::refuse(
              fmt::format("stage {} got {} tensors from the stage before, which routes more to it",
                          index, main.size()));
        }
        slot = main[next_main++];
        continue;
      }
      const Key key{flow.id, flow.microbatch, s, static_cast<int64_t>(q), false};
      Letter letter = take_from(workers.at(static_cast<size_t>(s)), key, stage_name + "'s forward");
      slot = letter.tensor;
      if (!letter.requires_grad || !at::GradMode::is_enabled()) continue;
      at::Tensor anchor = at::empty({0}, slot.options()).requires_grad_(true);
      auto exit = std::make_shared<PortalExit>(
          Key{flow.id, flow.microbatch, s, static_cast<int64_t>(q), true}, slot);
      exit->set_next_edges({torch::autograd::impl::gradient_edge(anchor)});
      torch::autograd::set_history(slot, exit);
      out.anchors.push_back(anchor);
    }
  }
  if (next_main != main.size()) {
    rpc::refuse(fmt::format("stage {} got {} tensors from the stage before, which routes {} to it",
                            index, main.size(), next_main));
  }
  out.inputs = c10::ivalue::Tuple::create({c10::List<at::Tensor>(std::move(inputs))});
  return out;
}

void offer_portals(const Routes& routes, int64_t index, const Flow& flow,
                   const c10::IValue& output_list, bool recomputed) {
  const auto& hops = routes.at(static_cast<size_t>(index));
  const std::vector<at::Tensor> output = output_tensors(routes, index, output_list);
  for (size_t q = 0; q < hops.size(); ++q) {
    if (hops[q].stage == index + 1) continue;
    const at::Tensor& t = output[q];
    // Detached, it shares the memory that the stage's graph keeps anyway.
    offer({flow.id, flow.microbatch, index, static_cast<int64_t>(q), false}, t.detach(),
          t.requires_grad() || (recomputed && t.is_floating_point()));
  }
}

c10::IValue join_portals(const Routes& routes, const std::vector<std::string>& workers,
                         int64_t index, const Flow& flow, const c10::IValue& output_list) {
  const auto& hops = routes.at(static_cast<size_t>(index));
  const std::vector<at::Tensor> output = output_tensors(routes, index, output_list);
  std::vector<at::Tensor> main;
  std::vector<size_t> portals;
  for (size_t q = 0; q < hops.size(); ++q) {
    if (hops[q].stage == index + 1) {
      main.push_back(output[q]);
    } else if (output[q].requires_grad()) {
      portals.push_back(q);
    }
  }
  if (portals.empty() || !at::GradMode::is_enabled()) return c10::List<at::Tensor>(main);
  if (main.empty() || !main.back().requires_grad()) {
    rpc::refuse(
        fmt::format("stage {} routes nothing that requires grad to the next stage, so the "
                    "gradients of what it sends further cannot join its backward",
                    index));
  }
  for (size_t q : portals) {
    main.back() =
        PortalJoin::apply(main.back(), output[q], workers.at(static_cast<size_t>(hops[q].stage)),
                          flow.id, flow.microbatch, index, static_cast<int64_t>(q));
  }
  return c10::List<at::Tensor>(main);
}

void drop_pipelined_portals() {
  std::lock_guard<std::mutex> lock(mailbox_mutex);
  for (auto it = mailbox.begin(); it != mailbox.end();) {
    it = std::get<1>(it->first) >= 0 ? mailbox.erase(it) : std::next(it);
  }
}

void install_portal_functions(rpc::FunctionRegistry& registry) {
  registry.add("ferry.portal.take", [](int64_t flow, int64_t microbatch, int64_t stage,
                                       int64_t element, bool gradient) {
    Letter letter = take_here({flow, microbatch, stage, element, gradient});
    return c10::ivalue::Tuple::create({std::move(letter.tensor), letter.requires_grad});
  });
  // What this worker offers that nobody took yet (for tests).
  registry.add("ferry.portal.waiting", []() {
    std::lock_guard<std::mutex> lock(mailbox_mutex);
    return static_cast<int64_t>(mailbox.size());
  });
}

}  // namespace ferry::remote_module
