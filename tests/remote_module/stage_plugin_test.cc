// Stage types from shared libraries: loaded into this process, and into a stock ferry-worker with
// --plugin. Each test runs in a process of its own (ctest), so a plugin loaded by one is not
// loaded in the next.
#include "ferry/remote_module/stage_plugin.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "ferry/remote_module/loss.h"
#include "ferry/remote_module/remote_module.h"
#include "ferry/remote_module/stage.h"
#include "ferry/rpc/error.h"
#include "tests/support/cluster.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"
#include "tests/support/training_runs.h"

namespace ferry::remote_module {
namespace {

using ferry::testing::error_of;
using ferry::testing::LocalWorld;
using ferry::testing::process_temp_dir;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(StagePlugin, RegistersItsStageTypesAsItLoads) {
  EXPECT_THAT(load_stage_plugin(FERRY_TEST_PLUGIN), ElementsAre("test.plugin.scale"));
  StageConfig config = stage_config();
  config.insert("factor", 3.0);
  std::unique_ptr<Stage> stage = make_stage("test.plugin.scale", config);
  at::Tensor x = torch::tensor({1.0f, 2.0f});
  EXPECT_TRUE(stage->forward({x}).toTensor().equal(torch::tensor({3.0f, 6.0f})));
  ASSERT_EQ(stage->named_parameters().size(), 1u);
  EXPECT_EQ(stage->named_parameters()[0].first, "scale");
  // Its loss too, by name, as a pipeline's last stage looks it up.
  EXPECT_THAT(registered_losses(), Contains("test.plugin.l1"));
  EXPECT_FLOAT_EQ(loss_function("test.plugin.l1")(x, torch::tensor({2.0f, 0.0f})).item<float>(),
                  1.5f);

  // A second copy of the library registers the same name again: an error naming the copy.
  const std::string copy = process_temp_dir().file("copy.so");
  std::filesystem::copy_file(FERRY_TEST_PLUGIN, copy,
                             std::filesystem::copy_options::overwrite_existing);
  const std::string twice = error_of([&] { load_stage_plugin(copy); });
  EXPECT_THAT(twice, HasSubstr("plugin \"" + copy +
                               "\": stage type \"test.plugin.scale\" is "
                               "already registered"));
  std::filesystem::remove(copy);
}

TEST(StagePlugin, BadLibrariesAreErrorsNamingTheFile) {
  const std::string missing = process_temp_dir().file("missing.so");
  EXPECT_THAT(error_of([&] { load_stage_plugin(missing); }),
              HasSubstr("plugin \"" + missing + "\": no such file"));

  const std::string text = process_temp_dir().file("text.so");
  std::ofstream(text) << std::string(200, '#') << " not a shared library\n";
  const std::string not_elf = error_of([&] { load_stage_plugin(text); });
  EXPECT_THAT(not_elf, HasSubstr("plugin \"" + text + "\": cannot be loaded: "));
  EXPECT_THAT(not_elf, HasSubstr("invalid ELF header"));
  std::filesystem::remove(text);

  EXPECT_THAT(error_of([&] { load_stage_plugin(FERRY_TEST_PLUGIN_EMPTY); }),
              HasSubstr(std::string("plugin \"") + FERRY_TEST_PLUGIN_EMPTY +
                        "\": registers no stage type"));
}

// A stock ferry-worker hosts the plugin's stage, which trains like any other (its parameter has a
// gradient through the worker).
TEST(StagePlugin, FerryWorkerHostsThePluginsStages) {
  LocalWorld::Settings settings;
  settings.peer_names = {"host"};
  settings.use_ferry_worker = true;
  settings.worker_args = {"--plugin", FERRY_TEST_PLUGIN};
  LocalWorld world(settings);
  StageConfig config = stage_config();
  config.insert("factor", 2.5);
  RemoteModule stage = RemoteModule::create("host", "test.plugin.scale", config);
  at::Tensor x = torch::tensor({2.0f});
  EXPECT_TRUE(stage.forward({x}).toTensor().equal(torch::tensor({5.0f})));
  EXPECT_EQ(stage.state_dict().at("scale").item<float>(), 2.5f);
}

TEST(StagePlugin, AWorkerWhosePluginFailsSaysWhichAndExits) {
  const std::string missing = process_temp_dir().file("absent.so");
  ferry::testing::CommandResult r =
      ferry::testing::run(ferry::testing::worker_binary() +
                          " --rank 1 --world-size 2 --master-addr 127.0.0.1 "
                          "--master-port 1 --plugin " +
                          missing);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("plugin \"" + missing + "\": no such file"));
}

}  // namespace
}  // namespace ferry::remote_module
