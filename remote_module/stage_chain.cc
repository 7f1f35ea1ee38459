// A chain of stages on their workers (RemoteModule::forward_chain and loss_chain): each worker runs
// its stage and sends the output straight on to the next stage's worker, so activations move
// from worker to worker and only the last stage's output, or the loss computed from it, comes
// back along the chain.
#include <fmt/format.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "ferry/core/compute_thread.h"
#include "ferry/remote_module/loss.h"
#include "ferry/remote_module/portal.h"
#include "ferry/remote_module/portal_flow.h"
#include "ferry/remote_module/stage_here.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"
#include "remote_module/installers.h"

namespace ferry::remote_module {
namespace {

rpc::FuturePtr completed(c10::IValue value) {
  auto done = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  done->markCompleted(std::move(value));
  return done;
}

// The loss a chain's last stage computes from its output: its registered name and the targets,
// which travel with the chain's requests (empty name: the chain returns the output).
struct ChainLoss {
  std::string name;
  at::Tensor target;
  bool wanted() const { return !name.empty(); }
  void append_to(std::vector<c10::IValue>& args) const {
    if (wanted()) args.insert(args.end(), {name, target});
  }
};

// What the chain's last stage, `module`, answers: its output, or the loss computed from it.
rpc::FuturePtr chain_result(const rpc::RRefPtr& module, c10::IValue out, const ChainLoss& loss) {
  if (!loss.wanted()) return completed(std::move(out));
  const std::string where = fmt::format("the loss \"{}\" after stage \"{}\" on worker \"{}\"",
                                        loss.name, stage_type_here(module), rpc::self().name);
  if (!out.isTensor()) {
    throw rpc::Error(
        rpc::ErrorKind::InvalidArgument,
        fmt::format("{}: the last stage must return one tensor, not {}", where, out.tagKind()));
  }
  try {
    LossFunction fn = loss_function(loss.name);
    return completed(core::on_compute_thread(
        [&] { return scalar_loss(loss.name, fn, out.toTensor(), loss.target); }));
  } catch (...) {
    rpc::Failure failure = rpc::failure_of(std::current_exception());
    throw rpc::Error(failure.kind, fmt::format("{}: {}", where, failure.message));
  }
}

// Stage `index` of a routed chain: its inputs gathered from the stage before and from portals,
// its output sent on by its routes. The last stage's output (or its loss) is the chain's.
rpc::FuturePtr forward_routed(const c10::List<c10::IValue>& stages, const c10::IValue& inputs,
                              int64_t index, const c10::IValue& routes_value, int64_t flow_id,
                              const ChainLoss& loss) {
  const Routes routes = routes_from_ivalue(routes_value);
  const auto count = static_cast<int64_t>(stages.size());
  if (index < 0 || index >= count || static_cast<int64_t>(routes.size()) != count) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("ferry.stage.forward_chain: stage {} of a chain of {} with "
                                 "routes for {}",
                                 index, count, routes.size()));
  }
  std::vector<std::string> workers;
  for (c10::IValue stage : stages) workers.push_back(rpc::to_rref(stage)->ownerName());
  const Flow flow{flow_id, -1};
  const c10::IValue args =
      index > 0 ? gather_portals(routes, workers, index, flow, inputs).inputs : inputs;
  const rpc::RRefPtr module = rpc::to_rref(stages.get(static_cast<size_t>(index)));
  c10::IValue out = forward_stage_here(module, args);
  if (index + 1 == count) return chain_result(module, std::move(out), loss);
  offer_portals(routes, index, flow, out);
  std::vector<c10::IValue> next{
      stages, c10::ivalue::Tuple::create({join_portals(routes, workers, index, flow, out)}),
      index + 1, routes_value, flow_id};
  loss.append_to(next);
  return rpc::rpc_async(workers[static_cast<size_t>(index + 1)], "ferry.stage.forward_chain",
                        std::move(next));
}

}  // namespace

void install_stage_chain(rpc::FunctionRegistry& registry) {
  // The first stage runs here; its output goes straight on to the next stage's worker, which
  // does the same, so activations move from worker to worker and only the last stage's output
  // comes back along the chain. The next call is made here, on the pool thread that runs this
  // request, so that it belongs to the request's autograd context; it is not waited for here.
  // Called with (stages, inputs) it takes the first of `stages` and passes the rest on; with
  // (stages, inputs, index, routes, flow) it runs stage `index` of the whole chain and sends each
  // element of its output where `routes` says (portal.h). Either form may end with (loss name,
  // targets): the last stage then answers with the loss instead of its output.
  registry.add_async("ferry.stage.forward_chain", [](std::vector<c10::IValue>& args) {
    ChainLoss loss;
    if ((args.size() == 4 || args.size() == 7) && args[args.size() - 2].isString() &&
        args.back().isTensor()) {
      loss = {args[args.size() - 2].toStringRef(), args.back().toTensor()};
      args.resize(args.size() - 2);
    }
    const bool routed = args.size() == 5 && args[2].isInt() && args[4].isInt();
    if ((args.size() != 2 && !routed) || !args[0].isList() || args[0].toListRef().empty() ||
        !args[1].isTuple()) {
      throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                       "ferry.stage.forward_chain takes (a list of stages, a tuple of inputs) or "
                       "(stages, inputs, stage index, routes, flow id)");
    }
    c10::List<c10::IValue> stages = args[0].toList();
    if (routed) {
      return forward_routed(stages, args[1], args[2].toInt(), args[3], args[4].toInt(), loss);
    }
    const rpc::RRefPtr first = rpc::to_rref(stages.get(0));
    c10::IValue out = forward_stage_here(first, args[1]);
    if (stages.size() == 1) return chain_result(first, std::move(out), loss);
    c10::impl::GenericList rest(c10::AnyType::get());
    for (size_t i = 1; i < stages.size(); ++i) rest.push_back(stages.get(i));
    std::string next = rpc::to_rref(rest.get(0))->ownerName();
    std::vector<c10::IValue> next_args{c10::IValue(rest),
                                       c10::ivalue::Tuple::create({std::move(out)})};
    loss.append_to(next_args);
    return rpc::rpc_async(next, "ferry.stage.forward_chain", std::move(next_args));
  });
}

}  // namespace ferry::remote_module
