// Runs on the caller's thread; every method is one call to the stage's worker.
#include "ferry/remote_module/remote_module.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ferry/remote_module/portal_flow.h"
#include "ferry/rpc/fan_out.h"
#include "ferry/rpc/rpc.h"

namespace ferry::remote_module {

RemoteModule RemoteModule::create(const std::string& worker, const std::string& type,
                                  StageConfig config) {
  return made(worker, type, rpc::remote(worker, "ferry.stage.create", {type, config}));
}

RemoteModule RemoteModule::from_torchscript(const std::string& worker, const std::string& path) {
  return made(worker, "torchscript " + path,
              rpc::remote(worker, "ferry.stage.load_torchscript", {path}));
}

RemoteModule RemoteModule::made(const std::string& worker, const std::string& type,
                                rpc::RRefPtr module) {
  rpc::FuturePtr ready = module->ready();
  ready->wait();
  if (ready->hasError()) {
    rpc::rethrow_as(ready->exception_ptr(),
                    fmt::format("cannot create stage \"{}\" on worker \"{}\"", type, worker));
  }
  return RemoteModule(worker, type, std::move(module));
}

c10::IValue RemoteModule::call(const std::string& what, const std::string& function,
                               std::vector<c10::IValue> args) const {
  args.insert(args.begin(), rpc::to_ivalue(module_));
  try {
    return rpc::rpc_sync(worker_, function, std::move(args));
  } catch (const rpc::Error&) {
    rpc::rethrow_as(
        std::current_exception(),
        fmt::format("{} of stage \"{}\" on worker \"{}\" failed", what, type_, worker_));
  }
}

c10::IValue RemoteModule::forward(std::vector<c10::IValue> inputs) const {
  return call("forward", "ferry.stage.forward", {c10::ivalue::Tuple::create(std::move(inputs))});
}

rpc::FuturePtr RemoteModule::forward_async(std::vector<c10::IValue> inputs) const {
  return rpc::rpc_async(worker_, "ferry.stage.forward",
                        {rpc::to_ivalue(module_), c10::ivalue::Tuple::create(std::move(inputs))});
}

c10::IValue RemoteModule::forward_chain(const std::vector<RemoteModule>& stages,
                                        std::vector<c10::IValue> inputs) {
  return forward_chain(stages, std::move(inputs), {});
}

c10::IValue RemoteModule::forward_chain(const std::vector<RemoteModule>& stages,
                                        std::vector<c10::IValue> inputs, const Routes& routes) {
  return chain(stages, std::move(inputs), routes, {});
}

at::Tensor RemoteModule::loss_chain(const std::vector<RemoteModule>& stages,
                                    std::vector<c10::IValue> inputs, const Routes& routes,
                                    const std::string& loss, const at::Tensor& target) {
  if (loss.empty() || !target.defined()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument, "loss_chain needs a loss name and targets");
  }
  return chain(stages, std::move(inputs), routes, {loss, target}).toTensor();
}

c10::IValue RemoteModule::chain(const std::vector<RemoteModule>& stages,
                                std::vector<c10::IValue> inputs, const Routes& routes,
                                std::vector<c10::IValue> loss) {
  if (stages.empty()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument, "forward_chain needs at least one stage");
  }
  check_routes(routes, stages.size());
  c10::impl::GenericList modules(c10::AnyType::get());
  std::vector<std::string> names;
  for (const RemoteModule& stage : stages) {
    modules.push_back(rpc::to_ivalue(stage.module_));
    names.push_back(fmt::format("\"{}\" on \"{}\"", stage.type_, stage.worker_));
  }
  std::vector<c10::IValue> args{modules, c10::ivalue::Tuple::create(std::move(inputs))};
  if (!routes.empty()) {
    args.insert(args.end(), {int64_t{0}, routes_to_ivalue(routes), new_flow_id()});
  }
  args.insert(args.end(), loss.begin(), loss.end());
  try {
    return rpc::rpc_sync(stages.front().worker_, "ferry.stage.forward_chain", std::move(args));
  } catch (const rpc::Error&) {
    rpc::rethrow_as(std::current_exception(),
                    fmt::format("forward through stages {} failed", fmt::join(names, ", ")));
  }
}

void RemoteModule::train(bool on) const { call("train", "ferry.stage.train", {on}); }

std::vector<rpc::RRefPtr> RemoteModule::remote_parameters() const {
  std::vector<rpc::RRefPtr> out;
  for (const auto& item : call("remote_parameters", "ferry.stage.parameters", {}).toList()) {
    out.push_back(rpc::to_rref(item));
  }
  return out;
}

int64_t RemoteModule::parameter_count() const { return stats().parameters; }

std::vector<BlockSeconds> RemoteModule::block_seconds() const {
  const c10::IValue reply = call("block_seconds", "ferry.stage.block_seconds", {});
  const auto& parts = reply.toTupleRef().elements();
  std::vector<BlockSeconds> out;
  const auto& names = parts.at(0).toListRef();
  const auto& forward = parts.at(1).toListRef();
  const auto& backward = parts.at(2).toListRef();
  for (size_t k = 0; k < names.size(); ++k) {
    out.push_back({names[k].toStringRef(), forward.at(k).toDouble(), backward.at(k).toDouble()});
  }
  return out;
}

StageStats RemoteModule::stats() const {
  auto info = call("stats", "ferry.stage.info", {}).toGenericDict();
  StageStats stats;
  stats.parameters = info.at("parameters").toInt();
  stats.parameter_bytes = info.at("parameter_bytes").toInt();
  stats.buffers = info.at("buffers").toInt();
  stats.forward_s = info.at("forward_s").toDouble();
  stats.forward_calls = info.at("forward_calls").toInt();
  stats.worker_peak_rss_mib = info.at("peak_rss_mib").toDouble();
  stats.worker_peak_tensor_mib =
      static_cast<double>(info.at("peak_tensor_bytes").toInt()) / (1 << 20);
  stats.worker_bytes_sent = info.at("bytes_sent").toInt();
  stats.device = info.at("device").toStringRef();
  stats.worker_device_copy_s = info.at("device_copy_s").toDouble();
  return stats;
}

int64_t RemoteModule::parameter_bytes() const { return stats().parameter_bytes; }

c10::Dict<std::string, at::Tensor> RemoteModule::state_dict() const {
  return call("state_dict", "ferry.stage.state_dict", {}).to<c10::Dict<std::string, at::Tensor>>();
}

void RemoteModule::load_state_dict(const c10::Dict<std::string, at::Tensor>& state,
                                   bool strict) const {
  call("load_state_dict", "ferry.stage.load_state_dict", {state, strict});
}

void RemoteModule::to(const std::string& device) const { call("to", "ferry.stage.to", {device}); }

int64_t RemoteModule::take_step_statistics(const std::vector<RemoteModule>& replicas,
                                           const std::string& key) {
  // Every copy joins the group at once: each call returns only when all have joined.
  rpc::FanOut calls;
  for (size_t r = 0; r < replicas.size(); ++r) {
    calls.call(replicas[r].worker_, "ferry.stage.take_step_statistics",
               {rpc::to_ivalue(replicas[r].module_), key, static_cast<int64_t>(r),
                static_cast<int64_t>(replicas.size())},
               fmt::format("step statistics of stage \"{}\" on worker \"{}\"", replicas[r].type_,
                           replicas[r].worker_));
  }
  const std::vector<c10::IValue> layers = calls.wait();
  return layers.empty() ? 0 : layers.back().toInt();
}

void RemoteModule::set_precision(Precision precision) const {
  call("set_precision", "ferry.stage.precision", {static_cast<int64_t>(precision)});
}

}  // namespace ferry::remote_module
