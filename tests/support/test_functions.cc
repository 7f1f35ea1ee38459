#include "tests/support/test_functions.h"

#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "dist_autograd/optimizer_factories.h"
#include "ferry/core/process_memory.h"
#include "ferry/dist_autograd/context.h"
#include "ferry/models/unet.h"
#include "ferry/pipeline/pipeline.h"
#include "ferry/remote_module/stage_host.h"
#include "ferry/rpc/rpc.h"
#include "tests/support/test_stages.h"

namespace ferry::testing {
namespace {

struct FailBackward : torch::autograd::Function<FailBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list) {
    throw std::runtime_error("injected backward failure");
  }
};

// Calls of sleep_ms and backward passes of slow_backward under way in this process: what a test
// waits for, through "sleeping", before it acts on a call in flight.
std::atomic<std::int64_t> sleeping{0};

void sleep_counted(std::int64_t ms) {
  ++sleeping;
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  --sleeping;
}

struct SlowBackward : torch::autograd::Function<SlowBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t ms) {
    ctx->saved_data["ms"] = ms;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    sleep_counted(ctx->saved_data["ms"].toInt());
    return {grads.at(0), at::Tensor()};
  }
};

}  // namespace

void register_test_functions(rpc::FunctionRegistry& registry) {
  register_test_stages();
  // A type of the user's own as register_optimizer takes it: no copy_state.
  dist_autograd::OptimizerFactory adam = dist_autograd::factory_of("adam");
  adam.copy_state = nullptr;
  dist_autograd::register_optimizer("test.adam_serialized_at_take", adam);
  models::register_unet_stages();
  pipeline::install(registry);
  registry.add("double_it", [](at::Tensor x) { return x * 2; });
  registry.add("chain", [](std::vector<std::string> hops, at::Tensor x) {
    at::Tensor y = x * 2;
    if (hops.empty()) return y;
    std::string next = hops.front();
    hops.erase(hops.begin());
    return rpc::rpc_sync(next, "chain", {hops, y}).toTensor();
  });
  registry.add("fail_backward", [](at::Tensor x) { return FailBackward::apply(x); });
  registry.add("slow_backward",
               [](at::Tensor x, int64_t ms) { return SlowBackward::apply(x, ms); });
  registry.add("add", [](at::Tensor a, at::Tensor b) { return a + b; });
  registry.add("echo", [](c10::IValue v) { return v; });
  registry.add_inline("inline_echo", [](std::vector<c10::IValue>& args) { return args.at(0); });
  registry.add("byte_count", [](at::Tensor t) { return static_cast<int64_t>(t.nbytes()); });
  registry.add("bytes_sent", []() { return static_cast<int64_t>(rpc::agent().bytes_sent()); });
  registry.add("tensor_live_bytes", []() { return core::tensor_memory().live_bytes; });
  registry.add("sleep_ms", [](int64_t ms) {
    sleep_counted(ms);
    return ms;
  });
  registry.add("sleeping", []() { return sleeping.load(); });
  registry.add("fail", [](std::string text) -> int64_t { throw std::runtime_error(text); });
  registry.add("whoami", []() { return rpc::self().name; });
  registry.add("pid", []() { return static_cast<int64_t>(::getpid()); });
  registry.add("relay", [](std::string to, std::string function, c10::IValue arg) {
    return rpc::rpc_sync(to, function, {std::move(arg)});
  });
  registry.add("owned_rrefs",
               []() { return static_cast<int64_t>(rpc::agent().owned_rref_count()); });
  registry.add("rref_value", [](rpc::RRefPtr rref) { return rref->to_here(); });
  registry.add("rref_owner", [](rpc::RRefPtr rref) { return rref->ownerName(); });
  registry.add("make_remote", [](std::string to, std::string function, c10::IValue arg) {
    return rpc::to_ivalue(rpc::remote(to, function, {arg}));
  });
  registry.add_async("relay_async", [](std::vector<c10::IValue>& args) {
    return rpc::rpc_async(args.at(0).toStringRef(), args.at(1).toStringRef(), {args.at(2)});
  });
}

}  // namespace ferry::testing
