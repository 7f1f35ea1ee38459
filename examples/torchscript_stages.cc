// ferry-torchscript-example: runs a model exported from Python in parts (see
// export_torchscript_stages.py) with each part on its own worker, and checks the result against
// the whole exported model run in this process.
//
//   /usr/bin/python3 examples/export_torchscript_stages.py /tmp/unet
//   export MASTER_ADDR=127.0.0.1 MASTER_PORT=29611 WORLD_SIZE=4
//   for r in 1 2 3; do RANK=$r build/bin/ferry-worker & done
//   RANK=0 build/bin/ferry-torchscript-example --dir /tmp/unet
#include <torch/script.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include "ferry/core/log.h"
#include "ferry/remote_module/remote_module.h"
#include "ferry/rpc/rpc.h"

int main(int argc, char** argv) {
  CLI::App app("Run a TorchScript model split into stages across three workers");
  std::string dir;
  int size = 64;
  app.add_option("--dir", dir, "folder with encoder.pt, decoder.pt, head.pt and full.pt")
      ->required();
  app.add_option("--image-size", size, "input height and width");
  CLI11_PARSE(app, argc, argv);

  ferry::rpc::Options options;
  options.name = "master";
  ferry::rpc::init(options);
  int status = 0;
  try {
    const auto& workers = ferry::rpc::workers();
    if (workers.size() < 4) throw std::runtime_error("needs a master and three workers");
    auto encoder =
        ferry::remote_module::RemoteModule::from_torchscript(workers[1].name, dir + "/encoder.pt");
    auto decoder =
        ferry::remote_module::RemoteModule::from_torchscript(workers[2].name, dir + "/decoder.pt");
    auto head =
        ferry::remote_module::RemoteModule::from_torchscript(workers[3].name, dir + "/head.pt");
    for (const auto* stage : {&encoder, &decoder, &head}) {
      stage->eval();
      ferry::log::info("{} on {}: {} parameters", stage->type(), stage->worker(),
                       stage->parameter_count());
    }
    at::Tensor x = torch::randn({2, 3, size, size});
    c10::IValue features = encoder.forward({x});
    at::Tensor mask = head.forward({decoder.forward({features})}).toTensor();

    torch::jit::Module full = torch::jit::load(dir + "/full.pt");
    full.eval();
    at::Tensor expected = full.forward({x}).toTensor();
    double diff = (mask - expected).abs().max().item<double>();
    ferry::log::info("output {} ; max |split - whole| = {:.3g}", c10::str(mask.sizes()), diff);
    status = diff < 1e-4 ? 0 : 1;
  } catch (const std::exception& e) {
    ferry::log::error("{}", e.what());
    status = 1;
  }
  ferry::rpc::shutdown();
  return status;
}
