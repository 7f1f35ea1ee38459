#include "ferry/remote_module/loss.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "ferry/core/text.h"
#include "ferry/rpc/error.h"
#include "ferry/rpc/rpc.h"

namespace ferry::remote_module {
namespace {

using rpc::refuse;

// The pixels a loss counts: all, or those whose target is not the ignore index.
at::Tensor counted(const at::Tensor& target, const LossOptions& o) {
  if (!o.ignore_index) return torch::ones_like(target, torch::kBool);
  return target.ne(*o.ignore_index);
}

// One logit per pixel takes a target of its shape. (Every loss computes in float32 whatever the
// stages computed in: bfloat16 logits lose too much in a mean.)
void check_binary(const char* name, const at::Tensor& logits, const at::Tensor& target) {
  if (logits.sizes() == target.sizes()) return;
  refuse(fmt::format(
      "the loss \"{}\" compares logits of shape {} with targets of the same shape, not {}{}", name,
      c10::str(logits.sizes()), c10::str(target.sizes()),
      logits.dim() > 1 && logits.size(1) > 1
          ? "; for masks of class ids use ce, dice, focal or ce+dice"
          : ""));
}

// K > 1 logits per pixel [B, K, ...] and class ids [B, ...] or [B, 1, ...]: the ids as int64
// [B, ...].
at::Tensor class_ids(const char* name, const at::Tensor& logits, const at::Tensor& target) {
  if (logits.dim() < 2 || logits.size(1) < 2) {
    refuse(
        fmt::format("the loss \"{}\" needs logits of 2 or more classes [B, K, H, W], not {}; "
                    "for one class use bce, dice or focal",
                    name, c10::str(logits.sizes())));
  }
  at::Tensor ids = target.dim() == logits.dim() && target.size(1) == 1 ? target.squeeze(1) : target;
  std::vector<int64_t> expected = logits.sizes().vec();
  expected.erase(expected.begin() + 1);
  if (ids.sizes().vec() != expected) {
    refuse(
        fmt::format("the loss \"{}\" takes logits {} with class ids of shape {} (or with a "
                    "channel of 1), not {}",
                    name, c10::str(logits.sizes()), c10::str(at::IntArrayRef(expected)),
                    c10::str(target.sizes())));
  }
  return ids.to(torch::kLong);
}

// The mean of `values` over the counted pixels; zero (with the graph kept) where none counts, as
// a micro-batch of ignored pixels must not make the step's loss NaN.
at::Tensor counted_mean(const at::Tensor& values, const at::Tensor& keep) {
  at::Tensor n = keep.sum();
  return torch::where(n > 0, (values * keep).sum() / n.clamp_min(1), values.sum() * 0);
}

at::Tensor bce(const at::Tensor& logits, const at::Tensor& target, const LossOptions& o) {
  check_binary("bce", logits, target);
  const at::Tensor x = logits.to(at::kFloat), t = target.to(at::kFloat);
  if (!o.ignore_index) return torch::binary_cross_entropy_with_logits(x, t);
  const at::Tensor keep = counted(target, o);
  namespace F = torch::nn::functional;
  at::Tensor each = F::binary_cross_entropy_with_logits(
      x, t * keep, F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone));
  return counted_mean(each, keep);
}

at::Tensor binary_dice(const at::Tensor& logits, const at::Tensor& target, const LossOptions& o) {
  check_binary("dice", logits, target);
  const at::Tensor keep = counted(target, o).to(at::kFloat);
  at::Tensor p = torch::sigmoid(logits.to(at::kFloat)) * keep;
  at::Tensor m = target.to(at::kFloat) * keep;
  return 1 - (2 * (p * m).sum() + 1) / (p.sum() + m.sum() + 1);
}

// smp's mode="multiclass": softmax, one-hot targets, each class's Dice over the batch's pixels
// (no smoothing; the denominator at least 1e-7), zero for a class absent from the targets, the
// mean over the classes.
at::Tensor multiclass_dice(const at::Tensor& logits, const at::Tensor& target,
                           const LossOptions& o) {
  const at::Tensor ids = class_ids("dice", logits, target);
  const int64_t classes = logits.size(1), batch = logits.size(0);
  at::Tensor p = logits.to(at::kFloat).log_softmax(1).exp().reshape({batch, classes, -1});
  const at::Tensor keep = counted(ids, o).reshape({batch, 1, -1}).to(at::kFloat);
  at::Tensor flat = (ids.reshape({batch, -1}) * keep.squeeze(1).to(at::kLong));
  at::Tensor truth = torch::one_hot(flat, classes).permute({0, 2, 1}).to(at::kFloat) * keep;
  p = p * keep;
  const std::vector<int64_t> dims{0, 2};
  at::Tensor intersection = (p * truth).sum(dims);
  at::Tensor cardinality = (p + truth).sum(dims);
  at::Tensor score = (2 * intersection) / cardinality.clamp_min(1e-7);
  at::Tensor present = truth.sum(dims).gt(0).to(at::kFloat);
  return ((1 - score) * present).mean();
}

// smp's focal_loss_with_logits with gamma 2 and no alpha, over the counted pixels.
at::Tensor focal_term(const at::Tensor& logits, const at::Tensor& target, const at::Tensor& keep) {
  namespace F = torch::nn::functional;
  at::Tensor logpt = F::binary_cross_entropy_with_logits(
      logits, target, F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone));
  at::Tensor each = (1 - torch::exp(-logpt)).pow(2) * logpt;
  return counted_mean(each, keep);
}

// One logit: the binary focal loss. K logits: smp's mode="multiclass", the sum over the classes
// of each one's focal loss against the others.
at::Tensor focal(const at::Tensor& logits, const at::Tensor& target, const LossOptions& o) {
  if (logits.dim() < 2 || logits.size(1) == 1) {
    check_binary("focal", logits, target);
    const at::Tensor keep = counted(target, o);
    return focal_term(logits.to(at::kFloat), (target.to(at::kFloat) * keep), keep);
  }
  const at::Tensor ids = class_ids("focal", logits, target);
  const at::Tensor keep = counted(ids, o);
  const at::Tensor x = logits.to(at::kFloat);
  at::Tensor sum = torch::zeros({}, x.options());
  for (int64_t c = 0; c < logits.size(1); ++c) {
    sum = sum + focal_term(x.select(1, c), ids.eq(c).to(at::kFloat), keep);
  }
  return sum;
}

at::Tensor dice(const at::Tensor& logits, const at::Tensor& target, const LossOptions& o) {
  if (logits.dim() > 1 && logits.size(1) > 1 && logits.sizes() != target.sizes()) {
    return multiclass_dice(logits, target, o);
  }
  return binary_dice(logits, target, o);
}

// torch's cross_entropy (class weights: the mean weighted by each pixel's class), but zero where
// no pixel counts.
at::Tensor ce(const at::Tensor& logits, const at::Tensor& target, const LossOptions& o) {
  const at::Tensor ids = class_ids("ce", logits, target);
  at::Tensor weights = torch::ones({logits.size(1)}, torch::kFloat);
  if (!o.class_weights.empty()) {
    if (static_cast<int64_t>(o.class_weights.size()) != logits.size(1)) {
      refuse(fmt::format("--class-weights has {} values for {} classes", o.class_weights.size(),
                         logits.size(1)));
    }
    weights = torch::tensor(o.class_weights, torch::kDouble).to(torch::kFloat);
  }
  namespace F = torch::nn::functional;
  const at::Tensor keep = counted(ids, o);
  const at::Tensor safe = ids * keep.to(at::kLong);  // an ignored pixel's id may be any value
  at::Tensor each = F::cross_entropy(logits.to(at::kFloat), safe,
                                     F::CrossEntropyFuncOptions().reduction(torch::kNone));
  const at::Tensor w = weights.to(logits.device()).index_select(0, safe.flatten()).view_as(safe) *
                       keep.to(at::kFloat);
  const at::Tensor total = w.sum();
  return torch::where(total > 0, (each * w).sum() / total.clamp_min(1e-30), each.sum() * 0);
}

at::Tensor mse(const at::Tensor& output, const at::Tensor& target) {
  return torch::mse_loss(output.to(at::kFloat), target.to(at::kFloat));
}

using Builtin = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const LossOptions&)>;

// Which options each built-in loss takes: class weights only where there is a cross-entropy.
struct BuiltinLoss {
  Builtin fn;
  bool takes_class_weights = false;
};

const std::map<std::string, BuiltinLoss>& builtins() {
  static const auto* losses = new std::map<std::string, BuiltinLoss>{
      {"bce", {bce}},
      {"dice", {dice}},
      {"focal", {focal}},
      {"bce+dice", {[](const at::Tensor& x, const at::Tensor& t, const LossOptions& o) {
         return bce(x, t, o) + binary_dice(x, t, o);
       }}},
      {"ce", {ce, true}},
      {"ce+dice",
       {[](const at::Tensor& x, const at::Tensor& t, const LossOptions& o) {
          return ce(x, t, o) + multiclass_dice(x, t, o);
        },
        true}},
  };
  return *losses;
}

struct LossRegistry {
  std::mutex mutex;
  std::map<std::string, LossFunction> losses{{"mse", mse}};
};

LossRegistry& loss_registry() {
  static auto* r = new LossRegistry();  // never destroyed: losses may register during static init
  return *r;
}

std::string where_am_i() { return rpc::is_initialized() ? rpc::self().name : "this process"; }

double parse_double(const std::string& text, const std::string& spec) {
  try {
    std::size_t used = 0;
    const double value = std::stod(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  refuse(fmt::format("loss \"{}\": \"{}\" is not a number", spec, text));
}

}  // namespace

std::string LossSpec::to_string() const {
  std::string out = name;
  if (options.ignore_index) out += fmt::format(";ignore_index={}", *options.ignore_index);
  if (!options.class_weights.empty()) {
    out += fmt::format(";class_weights={}", fmt::join(options.class_weights, ","));
  }
  return out;
}

LossSpec LossSpec::parse(const std::string& text) {
  const std::vector<std::string> parts = core::split(text, ';');
  LossSpec spec;
  spec.name = parts.front();
  for (std::size_t k = 1; k < parts.size(); ++k) {
    const std::string& part = parts[k];
    const std::size_t eq = part.find('=');
    const std::string key = part.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : part.substr(eq + 1);
    if (key == "ignore_index" && !value.empty()) {
      const double index = parse_double(value, text);
      if (index != static_cast<double>(static_cast<std::int64_t>(index))) {
        refuse(fmt::format("loss \"{}\": the ignore index must be a whole number", text));
      }
      spec.options.ignore_index = static_cast<std::int64_t>(index);
    } else if (key == "class_weights" && !value.empty()) {
      for (const std::string& weight : core::split(value, ',')) {
        spec.options.class_weights.push_back(parse_double(weight, text));
      }
    } else {
      refuse(fmt::format("loss \"{}\": unknown option \"{}\" (ignore_index=V, class_weights=W,...)",
                         text, part));
    }
  }
  return spec;
}

void register_loss(const std::string& name, LossFunction loss) {
  LossRegistry& r = loss_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (builtins().count(name) || !r.losses.emplace(name, std::move(loss)).second) {
    refuse(fmt::format("loss \"{}\" is already registered", name));
  }
}

std::vector<std::string> registered_losses() {
  std::vector<std::string> out;
  for (const auto& entry : builtins()) out.push_back(entry.first);
  LossRegistry& r = loss_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& entry : r.losses) out.push_back(entry.first);
  std::sort(out.begin(), out.end());
  return out;
}

LossFunction loss_function(const std::string& text) {
  const LossSpec spec = LossSpec::parse(text);
  auto builtin = builtins().find(spec.name);
  if (builtin != builtins().end()) {
    if (!spec.options.class_weights.empty() && !builtin->second.takes_class_weights) {
      refuse(
          fmt::format("the loss \"{}\" takes no class weights: they weigh the cross-entropy "
                      "(ce, ce+dice)",
                      spec.name));
    }
    return [fn = builtin->second.fn, options = spec.options](const at::Tensor& output,
                                                             const at::Tensor& target) {
      return fn(output, target, options);
    };
  }
  {
    LossRegistry& r = loss_registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.losses.find(spec.name);
    if (it != r.losses.end()) {
      if (!spec.options.empty()) {
        refuse(fmt::format("the loss \"{}\" takes no ignore index or class weights (\"{}\")",
                           spec.name, text));
      }
      return it->second;
    }
  }
  refuse(fmt::format("unknown loss \"{}\" on worker \"{}\" (registered: {})", spec.name,
                     where_am_i(), fmt::join(registered_losses(), ", ")));
}

at::Tensor scalar_loss(const std::string& name, const LossFunction& loss, const at::Tensor& output,
                       const at::Tensor& target) {
  at::Tensor value = loss(output, target);
  if (!value.defined() || value.numel() != 1) {
    throw rpc::Error(rpc::ErrorKind::InvalidArgument,
                     fmt::format("the loss \"{}\" must return a scalar, not a tensor of shape {}",
                                 name, value.defined() ? c10::str(value.sizes()) : "()"));
  }
  return value.reshape({});
}

}  // namespace ferry::remote_module
