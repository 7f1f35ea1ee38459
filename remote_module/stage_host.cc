// These functions run on the hosting worker's pool threads; each stage has a mutex so that calls
// on one stage do not overlap.
#include "ferry/remote_module/stage_host.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <torch/custom_class.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <set>

#include "ferry/core/compute_thread.h"
#include "ferry/core/process_memory.h"
#include "ferry/remote_module/portal.h"
#include "ferry/remote_module/portal_flow.h"
#include "ferry/remote_module/precision.h"
#include "ferry/remote_module/stage.h"
#include "ferry/remote_module/stage_here.h"
#include "ferry/rpc/collective_group.h"
#include "ferry/rpc/rpc.h"
#include "remote_module/installers.h"

namespace ferry::remote_module {
namespace {

// `device` as c10 parses it; rpc::Error(InvalidArgument) naming this process if it is not a
// device here.
c10::Device device_here(const std::string& device) {
  std::optional<c10::Device> parsed;
  try {
    parsed.emplace(device);
  } catch (const c10::Error&) {
  }
  const auto count = static_cast<int64_t>(torch::cuda::device_count());
  if (!parsed || (parsed->is_cuda() && (count == 0 || parsed->index() >= count)) ||
      (!parsed->is_cuda() && !parsed->is_cpu())) {
    const std::string who = rpc::is_initialized() ? fmt::format("worker \"{}\"", rpc::self().name)
                                                  : std::string("this process");
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("{} has no device {} (it has {} CUDA device{})", who, device,
                                 count, count == 1 ? "" : "s"));
  }
  return *parsed;
}

// Where this process's stages are built (set_default_device).
std::mutex default_device_mutex;
c10::Device default_device{c10::kCPU};

// A stage as an IValue, so that an RRef can own it and free it with the last reference.
struct StageHolder : torch::CustomClassHolder {
  StageHolder(std::string t, std::unique_ptr<Stage> s) : type(std::move(t)), stage(std::move(s)) {}
  std::string type;
  std::unique_ptr<Stage> stage;
  // Where its parameters and compute are (RemoteModule::to): inputs move there on arrival and
  // outputs back to CPU memory, which is what travels.
  c10::Device device{c10::kCPU};
  Precision precision = Precision::Float32;  // RemoteModule::set_precision
  std::mutex mutex;
  double forward_seconds = 0;  // under `mutex`
  int64_t forward_calls = 0;
};

void register_holder_class() {
  static auto holder = torch::class_<StageHolder>("ferry", "StageHolder");
}

c10::intrusive_ptr<StageHolder> holder_of(const rpc::RRefPtr& module) {
  return module->local_value().toCustomClass<StageHolder>();
}

// The stage's own error, said with the stage and worker it happened on.
[[noreturn]] void rethrow_in_stage(const StageHolder& holder, const std::string& what) {
  rpc::Failure failure = rpc::failure_of(std::current_exception());
  throw rpc::Error(failure.kind,
                   fmt::format("{} of stage \"{}\" on worker \"{}\": {}", what, holder.type,
                               rpc::self().name, failure.message),
                   "", failure.worker);
}

c10::Dict<std::string, at::Tensor> state_of(Stage& stage) {
  c10::Dict<std::string, at::Tensor> out;
  for (auto& [name, t] : stage.named_parameters()) out.insert(name, t.detach().cpu());
  for (auto& [name, t] : stage.named_buffers()) out.insert(name, t.detach().cpu());
  return out;
}

// `value` with `f` applied to every tensor in it (in lists and tuples too).
c10::IValue mapped(const c10::IValue& value,
                   const std::function<at::Tensor(const at::Tensor&)>& f) {
  if (value.isTensor()) return f(value.toTensor());
  if (value.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : value.toTensorList().vec()) out.push_back(f(t));
    return out;
  }
  if (value.isList()) {
    c10::impl::GenericList out(value.toList().elementType());
    for (const c10::IValue& item : value.toListRef()) out.push_back(mapped(item, f));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& item : value.toTupleRef().elements()) items.push_back(mapped(item, f));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

// This process's time copying stages' inputs, outputs and their gradients between the host and a
// GPU: what travels between workers is host memory.
std::atomic<int64_t> device_copy_nanoseconds{0};

// The copy alone: the device's queued kernels are waited for before the clock starts, and the
// copy itself after (one from pageable host memory may return before it lands).
at::Tensor timed_copy(const at::Tensor& t, const c10::Device& device) {
  torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  at::Tensor out = t.to(device);
  torch::cuda::synchronize();
  device_copy_nanoseconds +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  return out;
}

// A copy whose gradient's copy back is timed too.
struct TimedCopy : torch::autograd::Function<TimedCopy> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& t,
                            c10::Device device) {
    ctx->saved_data["from"] = t.device();
    return timed_copy(t, device);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const c10::Device from = ctx->saved_data["from"].toDevice();
    return {grads[0].defined() ? timed_copy(grads[0], from) : at::Tensor(), at::Tensor()};
  }
};

// Moved to `device`; differentiable, so gradients come back the same way.
c10::IValue moved_to(const c10::IValue& value, const c10::Device& device) {
  return mapped(value, [&device](const at::Tensor& t) {
    if (t.device() == device || (!t.is_cuda() && !device.is_cuda())) return t.to(device);
    return TimedCopy::apply(t, device);
  });
}

// Autocast to bfloat16 for `device`'s type on this thread while it lives, as torch.autocast's
// context manager: its cast weights are cached for the forward and dropped at the end, since an
// optimizer step changes the weights they were cast from.
class BFloat16Autocast {
 public:
  explicit BFloat16Autocast(const c10::Device& device) : type_(device.type()) {
    was_enabled_ = enabled(type_);
    was_dtype_ = dtype(type_);
    set(type_, true, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~BFloat16Autocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set(type_, was_enabled_, was_dtype_);
  }
  BFloat16Autocast(const BFloat16Autocast&) = delete;
  BFloat16Autocast& operator=(const BFloat16Autocast&) = delete;

 private:
  // LibTorch 2.4 takes the device type; the per-device functions before it are deprecated there.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  static bool enabled(c10::DeviceType type) { return at::autocast::is_autocast_enabled(type); }
  static at::ScalarType dtype(c10::DeviceType type) {
    return at::autocast::get_autocast_dtype(type);
  }
  static void set(c10::DeviceType type, bool on, at::ScalarType dtype) {
    at::autocast::set_autocast_enabled(type, on);
    at::autocast::set_autocast_dtype(type, dtype);
  }
#else
  static bool enabled(c10::DeviceType type) {
    return type == c10::kCUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
  }
  static at::ScalarType dtype(c10::DeviceType type) {
    return type == c10::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                              : at::autocast::get_autocast_cpu_dtype();
  }
  static void set(c10::DeviceType type, bool on, at::ScalarType dtype) {
    if (type == c10::kCUDA) {
      at::autocast::set_enabled(on);
      at::autocast::set_autocast_gpu_dtype(dtype);
    } else {
      at::autocast::set_cpu_enabled(on);
      at::autocast::set_autocast_cpu_dtype(dtype);
    }
  }
#endif

  c10::DeviceType type_;
  bool was_enabled_;
  at::ScalarType was_dtype_;
};

// The stage's forward in its precision.
c10::IValue forward_in_precision(StageHolder& holder, std::vector<c10::IValue> args) {
  if (holder.precision == Precision::Float32) return holder.stage->forward(std::move(args));
  c10::IValue out;
  {
    BFloat16Autocast autocast(holder.device);
    out = holder.stage->forward(std::move(args));
  }
  // Whatever autocast left in float32 (a sum, a sigmoid) leaves in bfloat16 too; differentiable,
  // so the gradient that comes back is bfloat16 as well.
  return mapped(
      out, [](const at::Tensor& t) { return t.is_floating_point() ? t.to(at::kBFloat16) : t; });
}

void load_state(Stage& stage, const c10::Dict<std::string, at::Tensor>& state, bool strict) {
  NamedTensors targets = stage.named_parameters();
  for (auto& b : stage.named_buffers()) targets.push_back(b);
  std::vector<std::string> missing, mis_shaped, unexpected;
  std::set<std::string> known;
  for (auto& [name, t] : targets) {
    known.insert(name);
    auto it = state.find(name);
    if (it == state.end()) {
      missing.push_back(name);
    } else if (it->value().sizes() != t.sizes()) {
      mis_shaped.push_back(fmt::format("{} (expected {}, got {})", name, c10::str(t.sizes()),
                                       c10::str(it->value().sizes())));
    }
  }
  for (const auto& entry : state) {
    if (known.count(entry.key()) == 0) unexpected.push_back(entry.key());
  }
  std::vector<std::string> problems;
  if (!mis_shaped.empty())
    problems.push_back(fmt::format("mis-shaped: {}", fmt::join(mis_shaped, ", ")));
  if (strict && !missing.empty())
    problems.push_back(fmt::format("missing: {}", fmt::join(missing, ", ")));
  if (strict && !unexpected.empty()) {
    problems.push_back(fmt::format("unexpected: {}", fmt::join(unexpected, ", ")));
  }
  if (!problems.empty()) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("state dict does not fit: {}", fmt::join(problems, "; ")));
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : targets) {
    auto it = state.find(name);
    if (it != state.end()) t.copy_(it->value());
  }
}

// One forward of `module`'s stage on the compute thread, timed for its stats.
c10::IValue forward_here(const rpc::RRefPtr& module, const c10::IValue& inputs) {
  auto holder = holder_of(module);
  return core::on_compute_thread([&] {
    std::lock_guard<std::mutex> lock(holder->mutex);
    auto start = std::chrono::steady_clock::now();
    try {
      std::vector<c10::IValue> args = inputs.toTupleRef().elements().vec();
      const bool away = holder->device != c10::Device(c10::kCPU);
      if (away) {
        for (c10::IValue& arg : args) arg = moved_to(arg, holder->device);
      }
      c10::IValue out = forward_in_precision(*holder, std::move(args));
      if (away) out = moved_to(out, c10::Device(c10::kCPU));
      holder->forward_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      ++holder->forward_calls;
      return out;
    } catch (...) {
      rethrow_in_stage(*holder, "forward");
    }
  });
}

}  // namespace

c10::IValue forward_stage_here(const rpc::RRefPtr& module, const c10::IValue& inputs) {
  return forward_here(module, inputs);
}

namespace {

std::vector<at::Tensor> tensors_here(const rpc::RRefPtr& module, NamedTensors (Stage::*named)()) {
  auto holder = holder_of(module);
  std::lock_guard<std::mutex> lock(holder->mutex);
  std::vector<at::Tensor> out;
  for (auto& [name, t] : ((*holder->stage).*named)()) out.push_back(t);
  return out;
}

}  // namespace

std::vector<at::Tensor> stage_parameters_here(const rpc::RRefPtr& module) {
  return tensors_here(module, &Stage::named_parameters);
}

std::vector<at::Tensor> stage_buffers_here(const rpc::RRefPtr& module) {
  return tensors_here(module, &Stage::named_buffers);
}

std::string stage_type_here(const rpc::RRefPtr& module) { return holder_of(module)->type; }

c10::Dict<std::string, at::Tensor> stage_state_here(const rpc::RRefPtr& module) {
  auto holder = holder_of(module);
  std::lock_guard<std::mutex> lock(holder->mutex);
  c10::Dict<std::string, at::Tensor> out;
  for (auto& [name, t] : holder->stage->named_parameters()) out.insert(name, t.detach());
  for (auto& [name, t] : holder->stage->named_buffers()) out.insert(name, t.detach());
  return out;
}

void load_stage_state_here(const rpc::RRefPtr& module,
                           const c10::Dict<std::string, at::Tensor>& state, bool strict) {
  auto holder = holder_of(module);
  core::run_on_compute_thread([&] {
    std::lock_guard<std::mutex> lock(holder->mutex);
    try {
      load_state(*holder->stage, state, strict);
    } catch (...) {
      rethrow_in_stage(*holder, "load_state_dict");
    }
  });
}

namespace {

// The stage `make` builds, on this process's default device, as an IValue an RRef can own.
c10::IValue held(const std::string& type, const std::function<std::unique_ptr<Stage>()>& make) {
  return core::on_compute_thread([&] {
    c10::Device device{c10::kCPU};
    {
      std::lock_guard<std::mutex> lock(default_device_mutex);
      device = default_device;
    }
    auto holder = c10::make_intrusive<StageHolder>(type, make());
    if (!device.is_cpu()) {
      holder->stage->to(device);
      holder->device = device;
    }
    return c10::IValue(std::move(holder));
  });
}

// Building a stage on this worker: a registered type from its config, or a TorchScript file.
void install_building(rpc::FunctionRegistry& registry) {
  registry.add("ferry.stage.create", [](std::string type, c10::IValue config) {
    StageConfig typed = stage_config();
    if (config.isGenericDict()) {
      for (const auto& entry : config.toGenericDict()) {
        if (!entry.key().isString()) {
          throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                           fmt::format("config keys of stage \"{}\" must be strings", type));
        }
        typed.insert(entry.key(), entry.value());
      }
    } else if (!config.isNone()) {
      throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                       fmt::format("config of stage \"{}\" must be a dict", type));
    }
    return held(type, [&] { return make_stage(type, typed); });
  });
  registry.add("ferry.stage.load_torchscript", [](std::string path) {
    return held("torchscript " + path, [&] { return load_torchscript_stage(path); });
  });
}

// Running it: a forward (a chain of them: stage_chain.cc), train or eval mode.
void install_running(rpc::FunctionRegistry& registry) {
  registry.add("ferry.stage.forward", [](rpc::RRefPtr module, c10::IValue inputs) {
    return forward_here(module, inputs);
  });
  registry.add("ferry.stage.train", [](rpc::RRefPtr module, bool on) {
    auto holder = holder_of(module);
    std::lock_guard<std::mutex> lock(holder->mutex);
    holder->stage->train(on);
  });
}

// Looking into it: sizes and counters, parameters as RRefs, its state to save and restore.
void install_inspecting(rpc::FunctionRegistry& registry) {
  registry.add("ferry.stage.info", [](rpc::RRefPtr module) {
    auto holder = holder_of(module);
    std::lock_guard<std::mutex> lock(holder->mutex);
    int64_t count = 0, bytes = 0;
    for (auto& [name, t] : holder->stage->named_parameters()) {
      count += t.numel();
      bytes += static_cast<int64_t>(t.nbytes());
    }
    int64_t buffers = static_cast<int64_t>(holder->stage->named_buffers().size());
    c10::impl::GenericDict info(c10::StringType::get(), c10::AnyType::get());
    info.insert("parameters", count);
    info.insert("parameter_bytes", bytes);
    info.insert("buffers", buffers);
    info.insert("forward_s", holder->forward_seconds);
    info.insert("forward_calls", holder->forward_calls);
    info.insert("peak_rss_mib", core::peak_rss_mib());
    info.insert("peak_tensor_bytes", core::tensor_memory().peak_bytes);
    info.insert("bytes_sent", static_cast<int64_t>(rpc::agent().bytes_sent()));
    info.insert("device", holder->device.str());
    info.insert("device_copy_s", static_cast<double>(device_copy_nanoseconds.load()) * 1e-9);
    return info;
  });
  registry.add("ferry.stage.block_seconds", [](rpc::RRefPtr module) {
    auto holder = holder_of(module);
    std::lock_guard<std::mutex> lock(holder->mutex);
    c10::List<std::string> names;
    c10::List<double> forward, backward;
    for (const BlockSeconds& b : holder->stage->block_seconds()) {
      names.push_back(b.name);
      forward.push_back(b.forward_s);
      backward.push_back(b.backward_s);
    }
    return c10::ivalue::Tuple::create({names, forward, backward});
  });
  registry.add("ferry.stage.parameter", [](rpc::RRefPtr module, int64_t index) {
    auto holder = holder_of(module);
    std::lock_guard<std::mutex> lock(holder->mutex);
    return holder->stage->named_parameters().at(index).second;
  });
  registry.add("ferry.stage.parameters", [](rpc::RRefPtr module) {
    size_t count;
    {
      auto holder = holder_of(module);
      std::lock_guard<std::mutex> lock(holder->mutex);
      count = holder->stage->named_parameters().size();
    }
    c10::impl::GenericList out(c10::AnyType::get());
    c10::IValue module_value = rpc::to_ivalue(module);
    for (size_t i = 0; i < count; ++i) {
      auto rref = rpc::remote(rpc::self().name, "ferry.stage.parameter",
                              {module_value, static_cast<int64_t>(i)});
      out.push_back(rpc::to_ivalue(rref));
    }
    return out;
  });
  registry.add("ferry.stage.state_dict", [](rpc::RRefPtr module) {
    auto holder = holder_of(module);
    return core::on_compute_thread([&] {
      std::lock_guard<std::mutex> lock(holder->mutex);
      return state_of(*holder->stage);
    });
  });
  registry.add("ferry.stage.load_state_dict",
               [](rpc::RRefPtr module, c10::Dict<std::string, at::Tensor> state, bool strict) {
                 load_stage_state_here(module, state, strict);
               });
}

// How it computes: precision, batch-norm statistics over a whole step, device.
void install_settings(rpc::FunctionRegistry& registry) {
  registry.add("ferry.stage.precision", [](rpc::RRefPtr module, int64_t precision) {
    if (precision != static_cast<int64_t>(Precision::Float32) &&
        precision != static_cast<int64_t>(Precision::BFloat16Mixed)) {
      throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                       fmt::format("ferry.stage.precision: no precision {}", precision));
    }
    auto holder = holder_of(module);
    std::lock_guard<std::mutex> lock(holder->mutex);
    holder->precision = static_cast<Precision>(precision);
  });
  registry.add("ferry.stage.take_step_statistics",
               [](rpc::RRefPtr module, std::string key, int64_t rank, int64_t size) {
                 auto holder = holder_of(module);
                 SumOverReplicas sum;
                 if (size > 1) {
                   // Formed here, not on the compute thread: it waits for every replica to join.
                   auto group = std::make_shared<rpc::CollectiveGroup>(
                       key, static_cast<int>(rank), static_cast<int>(size),
                       rpc::collective_backend_for(holder->device.type(), rpc::nccl_built()));
                   auto one_at_a_time = std::make_shared<std::mutex>();
                   sum = [group, one_at_a_time](std::vector<at::Tensor>& tensors) {
                     std::lock_guard<std::mutex> lock(*one_at_a_time);
                     group->sum(tensors);
                   };
                 }
                 int64_t layers = 0;
                 core::run_on_compute_thread([&] {
                   std::lock_guard<std::mutex> lock(holder->mutex);
                   layers = holder->stage->take_step_statistics(sum);
                 });
                 return layers;
               });
  registry.add("ferry.stage.to", [](rpc::RRefPtr module, std::string device) {
    auto holder = holder_of(module);
    core::run_on_compute_thread([&] {
      std::lock_guard<std::mutex> lock(holder->mutex);
      const c10::Device target = device_here(device);
      holder->stage->to(target);
      holder->device = target;
    });
  });
}

}  // namespace

void set_default_device(const std::string& device) {
  const c10::Device target = device_here(device);
  std::lock_guard<std::mutex> lock(default_device_mutex);
  default_device = target;
}

void install(rpc::FunctionRegistry& registry) {
  if (registry.contains("ferry.stage.create")) return;
  register_holder_class();
  install_portal_functions(registry);
  install_building(registry);
  install_running(registry);
  install_stage_chain(registry);
  install_inspecting(registry);
  install_settings(registry);
  install_state_handover(registry);
}

}  // namespace ferry::remote_module
