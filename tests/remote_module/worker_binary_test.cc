// ferry-worker, the binary users run, hosting stages for this process as master.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <unistd.h>

#include "ferry/core/processes.h"
#include "ferry/remote_module/remote_module.h"
#include "ferry/rpc/rpc.h"
#include "tests/support/cluster.h"

namespace ferry::remote_module {
namespace {

using ferry::testing::LocalWorld;
using ferry::testing::worker_binary;
using std::chrono::milliseconds;

TEST(FerryWorker, HostsTorchScriptStagesAndExitsCleanlyAtShutdown) {
  std::string path =
      ::testing::TempDir() + "ferry_worker_stage_" + std::to_string(::getpid()) + ".pt";
  torch::jit::Module m("Scale");
  m.register_parameter("factor", torch::full({1}, 3.0), false);
  m.define("def forward(self, x):\n    return x * self.factor\n");
  m.save(path);

  LocalWorld::Settings settings;
  settings.peer_names = {"encoder-host", "decoder-host"};
  settings.use_ferry_worker = true;
  auto world = std::make_unique<LocalWorld>(settings);
  RemoteModule stage = RemoteModule::from_torchscript("decoder-host", path);
  at::Tensor x = torch::randn({4});
  EXPECT_TRUE(torch::equal(stage.forward({x}).toTensor(), x * 3.0));
  // The worker knows no stage types of the tests: only what its binary registers.
  try {
    RemoteModule::create("encoder-host", "test.mlp");
    FAIL();
  } catch (const rpc::Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "unknown stage type \"test.mlp\" (registered: "
                  "synthetic.mlp, unet.blocks, unet.decoder, unet.encoder, unet.head)"),
              std::string::npos)
        << e.what();
  }
  auto statuses = world->finish();  // graceful shutdown of the master; the workers follow
  std::remove(path.c_str());
  ASSERT_EQ(statuses.size(), 2u);
  for (const auto& status : statuses) {
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status));
    EXPECT_EQ(WEXITSTATUS(*status), 0);
  }
}

// A device the worker lacks, or one no worker can have, ends it before it joins any world, with
// what it was asked for and what it has: no master is needed to see it.
TEST(FerryWorker, ADeviceItLacksIsRefusedBeforeItJoins) {
  using ::testing::AllOf;
  using ::testing::HasSubstr;
  const auto visible = static_cast<int64_t>(torch::cuda::device_count());
  const std::string missing = "cuda:" + std::to_string(visible + 3);
  const std::vector<std::string> joining = {"--rank",        "1",         "--world-size",  "2",
                                            "--master-addr", "127.0.0.1", "--master-port", "9"};
  std::vector<std::string> command = {worker_binary(), "--device", missing};
  command.insert(command.end(), joining.begin(), joining.end());
  core::CommandOutput out = core::run_process(command, {{{"LOCAL_RANK", "0"}}, {}});
  EXPECT_EQ(out.status, 2) << out.output;
  EXPECT_THAT(out.output, AllOf(HasSubstr("--device " + missing),
                                HasSubstr(std::to_string(visible) + " CUDA device")));

  command = {worker_binary(), "--device", "gpu0"};
  command.insert(command.end(), joining.begin(), joining.end());
  out = core::run_process(command, {});
  EXPECT_NE(out.status, 0) << out.output;
  EXPECT_THAT(out.output, HasSubstr("--device: must be auto, cpu, cuda or cuda:N, not \"gpu0\""));
}

}  // namespace
}  // namespace ferry::remote_module
