// custom-master: rank 0 of a world whose other ranks host "custom.affine" (custom-worker, or
// ferry-worker --plugin libcustom_stages.so). It builds a three-stage network, one stage per
// worker in turn, and fits y = sin(x0 + x1 - x2 + x3) with distributed autograd and Adam. Exits 0
// when the loss fell to a tenth.
#include <ferry/dist_autograd/context.h>
#include <ferry/dist_autograd/optimizer.h>
#include <ferry/pipeline/pipeline.h>
#include <ferry/remote_module/remote_module.h>
#include <ferry/rpc/rpc.h>
#include <torch/torch.h>

#include <cstdio>

namespace {

ferry::remote_module::StageConfig affine(int64_t in, int64_t out, bool tanh, int64_t seed) {
  ferry::remote_module::StageConfig config = ferry::remote_module::stage_config();
  config.insert("in", in);
  config.insert("out", out);
  config.insert("tanh", int64_t{tanh});
  config.insert("seed", seed);
  return config;
}

int train() {
  std::vector<std::string> workers;
  for (const auto& w : ferry::rpc::workers()) {
    if (w.rank != ferry::rpc::self().rank) workers.push_back(w.name);
  }
  if (workers.empty()) {
    std::fprintf(stderr, "custom-master: the world has no worker\n");
    return 2;
  }
  const std::vector<ferry::remote_module::StageConfig> configs = {
      affine(4, 32, true, 1), affine(32, 32, true, 2), affine(32, 1, false, 3)};
  std::vector<ferry::remote_module::RemoteModule> stages;
  std::vector<ferry::rpc::RRefPtr> params;
  for (size_t k = 0; k < configs.size(); ++k) {
    stages.push_back(ferry::remote_module::RemoteModule::create(workers[k % workers.size()],
                                                                "custom.affine", configs[k]));
    for (auto& p : stages.back().remote_parameters()) params.push_back(p);
    std::printf("stage %zu on %s\n", k, stages.back().worker().c_str());
  }
  ferry::dist_autograd::DistributedOptimizer optimizer(
      ferry::dist_autograd::OptimizerSpec::adam(0.01), params);

  torch::manual_seed(0);
  const at::Tensor x = torch::randn({256, 4});
  const at::Tensor y =
      torch::sin(x.select(1, 0) + x.select(1, 1) - x.select(1, 2) + x.select(1, 3)).unsqueeze(1);
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    ferry::dist_autograd::Context context;
    // Activations go from worker to worker; only x leaves this process.
    at::Tensor out = ferry::remote_module::RemoteModule::forward_chain(stages, {x}).toTensor();
    at::Tensor loss = torch::mse_loss(out, y);
    ferry::dist_autograd::backward(context.id(), {loss});
    optimizer.step(context.id());
    last = loss.item<double>();
    if (step == 0) first = last;
  }
  std::printf("loss %.4f -> %.4f after 150 steps\n", first, last);
  return last < 0.1 * first ? 0 : 1;
}

}  // namespace

int main() {
  // Every process of the world installs Ferry's functions before init, the master too.
  ferry::pipeline::install(ferry::rpc::default_registry());
  ferry::rpc::Options options;
  options.name = "master";
  int code = 2;
  try {
    ferry::rpc::init(options);
    code = train();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "custom-master: %s\n", e.what());
  }
  ferry::rpc::shutdown(code == 0);
  return code;
}
