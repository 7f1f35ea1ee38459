// The optimizer types "ferry.optim.create" builds by name: sgd, adam and adamw, and those that
// register_optimizer adds, with the options each takes.
#include "dist_autograd/optimizer_factories.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim.h>

#include <set>
#include <shared_mutex>

#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"

namespace ferry::dist_autograd {
namespace {

using Options = std::map<std::string, double>;

// Reads the options a type takes; any other key is an error listing the ones it takes.
class OptionReader {
 public:
  OptionReader(std::string type, const Options& options, std::set<std::string> known)
      : type_(std::move(type)), options_(options), known_(std::move(known)) {
    for (const auto& [key, value] : options_) {
      if (!known_.count(key)) {
        throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                         fmt::format("optimizer \"{}\" has no option \"{}\" (it takes: {})", type_,
                                     key, fmt::join(known_, ", ")));
      }
    }
  }
  double get(const std::string& key, double fallback) const {
    auto it = options_.find(key);
    return it == options_.end() ? fallback : it->second;
  }
  double required(const std::string& key) const {
    auto it = options_.find(key);
    if (it == options_.end()) {
      throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                       fmt::format("optimizer \"{}\" needs option \"{}\"", type_, key));
    }
    return it->second;
  }

 private:
  std::string type_;
  const Options& options_;
  std::set<std::string> known_;
};

// A tensor of a state, copied to host memory: a device's memory is what a model is split to save.
at::Tensor host_copy(const at::Tensor& t) {
  return t.defined() ? t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true) : t;
}

template <typename State>
std::unique_ptr<torch::optim::OptimizerParamState> copy_adam_like(
    const torch::optim::OptimizerParamState& state) {
  auto out = std::make_unique<State>(static_cast<const State&>(state));
  out->exp_avg(host_copy(out->exp_avg()));
  out->exp_avg_sq(host_copy(out->exp_avg_sq()));
  out->max_exp_avg_sq(host_copy(out->max_exp_avg_sq()));
  return out;
}

template <typename AdamLike, typename AdamLikeOptions, typename State>
OptimizerFactory adam_like(const std::string& type, double default_weight_decay) {
  OptimizerFactory factory;
  factory.make = [type, default_weight_decay](std::vector<at::Tensor> params,
                                              const Options& options) {
    OptionReader o(type, options, {"lr", "beta1", "beta2", "eps", "weight_decay", "amsgrad"});
    AdamLikeOptions defaults(o.required("lr"));
    defaults.betas(std::make_tuple(o.get("beta1", 0.9), o.get("beta2", 0.999)))
        .eps(o.get("eps", 1e-8))
        .weight_decay(o.get("weight_decay", default_weight_decay))
        .amsgrad(o.get("amsgrad", 0) != 0);
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<AdamLike>(std::move(params), defaults));
  };
  factory.make_state = [] {
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::make_unique<State>());
  };
  factory.copy_state = copy_adam_like<State>;
  return factory;
}

struct Factories {
  std::shared_mutex mutex;
  std::map<std::string, OptimizerFactory> by_name;

  Factories() {
    OptimizerFactory sgd;
    sgd.make = [](std::vector<at::Tensor> params, const Options& options) {
      OptionReader o("sgd", options, {"lr", "momentum", "dampening", "weight_decay", "nesterov"});
      torch::optim::SGDOptions defaults(o.required("lr"));
      defaults.momentum(o.get("momentum", 0))
          .dampening(o.get("dampening", 0))
          .weight_decay(o.get("weight_decay", 0))
          .nesterov(o.get("nesterov", 0) != 0);
      return std::unique_ptr<torch::optim::Optimizer>(
          std::make_unique<torch::optim::SGD>(std::move(params), defaults));
    };
    sgd.make_state = [] {
      return std::unique_ptr<torch::optim::OptimizerParamState>(
          std::make_unique<torch::optim::SGDParamState>());
    };
    sgd.copy_state = [](const torch::optim::OptimizerParamState& state) {
      auto out = std::make_unique<torch::optim::SGDParamState>(
          static_cast<const torch::optim::SGDParamState&>(state));
      out->momentum_buffer(host_copy(out->momentum_buffer()));
      return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(out));
    };
    by_name["sgd"] = sgd;
    by_name["adam"] =
        adam_like<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(
            "adam", 0);
    by_name["adamw"] =
        adam_like<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
            "adamw", 1e-2);
  }
};

Factories& factories() {
  static Factories f;
  return f;
}

}  // namespace

OptimizerFactory factory_of(const std::string& name) {
  Factories& f = factories();
  std::shared_lock<std::shared_mutex> lock(f.mutex);
  auto it = f.by_name.find(name);
  if (it == f.by_name.end()) {
    std::vector<std::string> names;
    for (const auto& [known, unused] : f.by_name) names.push_back(known);
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("no optimizer is named \"{}\" on worker \"{}\" (known: {})", name,
                                 rpc::self().name, fmt::join(names, ", ")));
  }
  return it->second;
}

OptimizerSpec OptimizerSpec::sgd(double lr, double momentum, double weight_decay) {
  return {"sgd", {{"lr", lr}, {"momentum", momentum}, {"weight_decay", weight_decay}}};
}
OptimizerSpec OptimizerSpec::adam(double lr, double weight_decay) {
  return {"adam", {{"lr", lr}, {"weight_decay", weight_decay}}};
}
OptimizerSpec OptimizerSpec::adamw(double lr, double weight_decay) {
  return {"adamw", {{"lr", lr}, {"weight_decay", weight_decay}}};
}

void register_optimizer(const std::string& name, OptimizerFactory factory) {
  Factories& f = factories();
  std::unique_lock<std::shared_mutex> lock(f.mutex);
  f.by_name[name] = std::move(factory);
}

}  // namespace ferry::dist_autograd
