#include "ferry/remote_module/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "ferry/core/files.h"
#include "ferry/remote_module/checkpoint_writer.h"
#include "ferry/remote_module/state_handover.h"
#include "ferry/rpc/parked.h"
#include "ferry/rpc/rpc.h"
#include "tests/support/cluster.h"
#include "tests/support/temp_dir.h"

namespace ferry::remote_module {
namespace {

using ferry::testing::LocalWorld;
namespace fs = std::filesystem;

StageConfig mlp(int64_t seed) {
  StageConfig config = stage_config();
  config.insert("in", int64_t{6});
  config.insert("hidden", int64_t{10});
  config.insert("out", int64_t{2});
  config.insert("seed", seed);
  return config;
}

TEST(Checkpoint, RestoresEveryStageIntoStagesOnOtherWorkers) {
  LocalWorld::Settings settings;
  settings.peer_names = {"a", "b", "c"};
  LocalWorld world(settings);
  ferry::testing::TempDir dir("checkpoint");
  NamedStages trained = {{"encoder", RemoteModule::create("a", "test.mlp", mlp(1))},
                         {"head", RemoteModule::create("b", "test.mlp", mlp(2))}};
  std::string first = save_checkpoint(dir.path(), trained);
  EXPECT_TRUE(fs::exists(first + "/encoder.pt"));
  EXPECT_TRUE(fs::exists(first + "/manifest.json"));

  // Another run: the same stages, initialised differently, on other workers.
  NamedStages resumed = {{"encoder", RemoteModule::create("c", "test.mlp", mlp(3))},
                         {"head", RemoteModule::create("a", "test.mlp", mlp(4))}};
  at::Tensor x = torch::randn({4, 6});
  EXPECT_FALSE(torch::equal(resumed[0].second.forward({x}).toTensor(),
                            trained[0].second.forward({x}).toTensor()));
  load_checkpoint(dir.path(), resumed);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(torch::equal(resumed[i].second.forward({x}).toTensor(),
                             trained[i].second.forward({x}).toTensor()));
  }
}

TEST(Checkpoint, LatestMovesOnlyAfterAWholeSaveAndOldOnesArePruned) {
  LocalWorld world;
  ferry::testing::TempDir dir("checkpoint");
  NamedStages stages = {{"only", RemoteModule::create("a", "test.mlp", mlp(1))}};
  std::string first = save_checkpoint(dir.path(), stages);
  std::string second = save_checkpoint(dir.path(), stages);
  std::string third = save_checkpoint(dir.path(), stages);
  std::ifstream latest(dir.path() + "/LATEST");
  std::string name;
  latest >> name;
  EXPECT_EQ(dir.path() + "/" + name, third);
  EXPECT_FALSE(fs::exists(first));
  EXPECT_TRUE(fs::exists(second));
  // A save that dies half way (a folder without manifest, a stray temp file) changes nothing.
  fs::create_directories(dir.path() + "/ckpt-99");
  std::ofstream(dir.path() + "/ckpt-99/only.pt.tmp") << "partial";
  load_checkpoint(dir.path(), stages);
  // The next save clears that debris.
  std::string fourth = save_checkpoint(dir.path(), stages);
  EXPECT_EQ(fourth, dir.path() + "/ckpt-100");
  EXPECT_FALSE(fs::exists(dir.path() + "/ckpt-99"));
  EXPECT_TRUE(fs::exists(third));
  EXPECT_FALSE(fs::exists(second));
}

TEST(Checkpoint, MissingCheckpointsAndStagesAreNamed) {
  LocalWorld world;
  ferry::testing::TempDir dir("checkpoint");
  NamedStages stages = {{"encoder", RemoteModule::create("a", "test.mlp", mlp(1))}};
  try {
    load_checkpoint(dir.path(), stages);
    FAIL();
  } catch (const rpc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no checkpoint in \"" + dir.path() + "\""),
              std::string::npos);
  }
  save_checkpoint(dir.path(), stages);
  NamedStages other = {{"decoder", stages[0].second}};
  try {
    load_checkpoint(dir.path(), other);
    FAIL();
  } catch (const rpc::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no stage \"decoder\" (it has: encoder)"),
              std::string::npos)
        << e.what();
  }
}

// In the background: the state as it was when taken, though the stage trains on; checkpoints on
// disk in the order given; a write that fails is thrown by the next wait, naming the folder.
TEST(CheckpointWriter, WritesTheStateAsTakenInOrderAndReportsAFailedWrite) {
  LocalWorld world;
  ferry::testing::TempDir dir("checkpoint");
  NamedStages stages = {{"only", RemoteModule::create("a", "test.mlp", mlp(1))}};
  const c10::Dict<std::string, at::Tensor> taken = stages[0].second.state_dict();
  CheckpointContent first = gather_checkpoint(stages, {{"step", int64_t{10}}});
  stages[0].second.load_state_dict(
      RemoteModule::create("a", "test.mlp", mlp(2)).state_dict());  // the stage moves on
  std::vector<std::string> written;
  {
    CheckpointWriter writer;
    auto note = [&written](const std::string& folder, double take_s, double write_s) {
      EXPECT_GE(take_s, 0);
      EXPECT_GE(write_s, 0);
      written.push_back(folder);
    };
    writer.save(dir.path(), std::move(first), 3, note);
    writer.save(dir.path(), gather_checkpoint(stages, {{"step", int64_t{20}}}), 3, note);
    writer.wait();
    ASSERT_EQ(written.size(), 2u);
    EXPECT_EQ(written, checkpoint_folders(dir.path()));
    EXPECT_EQ(latest_checkpoint_folder(dir.path()), written[1]);
    EXPECT_EQ(read_checkpoint_value(written[1], "step").toInt(), 20);
    const SavedCheckpoint saved = read_checkpoint(written[0]);
    const c10::Dict<std::string, at::Tensor> merged = merged_state(saved);
    for (const auto& item : taken) EXPECT_TRUE(merged.at(item.key()).equal(item.value()));
    // The stage's file is what torch.save (torch::pickle_save) makes of the state taken, byte
    // for byte, though it is pickled straight to disk.
    const std::vector<char> pickled = torch::pickle_save(c10::IValue(taken));
    EXPECT_EQ(core::read_whole_file(written[0] + "/only.pt"),
              std::string(pickled.begin(), pickled.end()));

    const std::string blocked = dir.path() + "/not-a-folder";
    std::ofstream(blocked) << "a file";
    writer.save(blocked + "/ckpt", gather_checkpoint(stages), 3);
    try {
      writer.wait();
      FAIL() << "a write into a file's path succeeded";
    } catch (const rpc::Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(blocked)) << e.what();
    }
    // The failure was said once; the writer writes again.
    writer.save(dir.path(), gather_checkpoint(stages, {{"step", int64_t{30}}}), 3, note);
  }
  ASSERT_EQ(written.size(), 3u);
  EXPECT_EQ(read_checkpoint_value(latest_checkpoint_folder(dir.path()), "step").toInt(), 30);
}

// A checkpoint taken in two halves: the worker copies its stage's state at once, the writer
// brings the copy here later, after the stage has moved on. A take that fails (its worker gone)
// is said by wait_taken(), and the last one brought here stays the one before it.
TEST(CheckpointWriter, TakesCopiesHeldOnTheWorkersAndKeepsTheLastOneBroughtHere) {
  LocalWorld world;
  ferry::testing::TempDir dir("checkpoint");
  NamedStages stages = {{"only", RemoteModule::create("a", "test.mlp", mlp(1))}};
  const c10::Dict<std::string, at::Tensor> before = stages[0].second.state_dict();
  CheckpointWriter::Take take = take_checkpoint(stages, {{"step", int64_t{1}}},
                                                {{"late", [] { return c10::IValue(int64_t{7}); }}});
  stages[0].second.load_state_dict(RemoteModule::create("a", "test.mlp", mlp(2)).state_dict());
  CheckpointWriter writer;
  EXPECT_FALSE(writer.last_taken().has_value());
  writer.save(dir.path(), take, 2);
  writer.wait_taken();
  std::optional<CheckpointContent> last = writer.last_taken();
  ASSERT_TRUE(last.has_value());
  ASSERT_EQ(last->stages.size(), 1u);
  EXPECT_EQ(last->stages[0].worker, "a");
  for (const auto& item : before) {
    EXPECT_TRUE(last->stages[0].state.at(item.key()).equal(item.value())) << item.key();
  }
  EXPECT_EQ(last->extra.at("late").toInt(), 7);
  writer.wait();
  EXPECT_EQ(read_checkpoint_value(latest_checkpoint_folder(dir.path()), "step").toInt(), 1);

  writer.save(
      dir.path(),
      []() -> CheckpointContent {
        throw rpc::Error(rpc::ErrorKind::PeerDied, "worker \"a\" was lost");
      },
      2);
  try {
    writer.wait_taken();
    FAIL() << "a take that failed was not said";
  } catch (const rpc::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("worker \"a\" was lost"));
  }
  EXPECT_EQ(writer.last_taken()->extra.at("step").toInt(), 1);
}

// What export reads: a checkpoint's files without stages to load them into.
TEST(Checkpoint, ReadsBackWithoutStagesAndMergesItsStagesIntoOneStateDict) {
  LocalWorld::Settings settings;
  settings.peer_names = {"a", "b"};
  LocalWorld world(settings);
  ferry::testing::TempDir dir("checkpoint");
  NamedStages one = {{"encoder", RemoteModule::create("a", "test.mlp", mlp(1))}};
  EXPECT_TRUE(checkpoint_folders(dir.path()).empty());
  const std::string first = save_checkpoint(dir.path(), one, 2, {{"epoch", int64_t{1}}});
  const std::string second = save_checkpoint(dir.path(), one, 2, {{"epoch", int64_t{2}}});
  EXPECT_EQ(checkpoint_folders(dir.path()), (std::vector<std::string>{first, second}));
  EXPECT_EQ(latest_checkpoint_folder(dir.path()), second);
  EXPECT_EQ(read_checkpoint_value(first, "epoch").toInt(), 1);
  try {
    read_checkpoint_value(first, "step");
    FAIL() << "a value that was not saved was read";
  } catch (const rpc::Error& e) {
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr("checkpoint \"" + first + "\" saved no value \"step\""));
  }

  const SavedCheckpoint saved = read_checkpoint(second);
  ASSERT_EQ(saved.stages.size(), 1u);
  EXPECT_EQ(saved.stages[0].first, "encoder");
  EXPECT_EQ(saved.extra.at("epoch").toInt(), 2);
  const c10::Dict<std::string, at::Tensor> state = one[0].second.state_dict();
  const c10::Dict<std::string, at::Tensor> merged = merged_state(saved);
  ASSERT_EQ(merged.size(), state.size());
  for (const auto& item : state) EXPECT_TRUE(merged.at(item.key()).equal(item.value()));

  // Written as one file, it reads back as the same tensors.
  save_state_dict(merged, dir.path() + "/whole.pt");
  const std::string file = core::read_whole_file(dir.path() + "/whole.pt");
  std::vector<char> bytes(file.begin(), file.end());
  auto back = torch::pickle_load(bytes).to<c10::Dict<std::string, at::Tensor>>();
  ASSERT_EQ(back.size(), state.size());
  for (const auto& item : state) EXPECT_TRUE(back.at(item.key()).equal(item.value()));

  // Two stages of one type hold tensors of the same names: not one model.
  NamedStages two = {{"left", one[0].second},
                     {"right", RemoteModule::create("b", "test.mlp", mlp(2))}};
  const std::string both = save_checkpoint(dir.path(), two);
  try {
    merged_state(read_checkpoint(both));
    FAIL() << "stages of the same tensor names were merged";
  } catch (const rpc::Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("stages \"left\" and \"right\" both have tensor"));
  }
}

// A checkpoint's copies travel a part at a time, so that a step's calls pass between them.
TEST(Checkpoint, AStageSnapshotComesHereInPartsOfTheSizeAskedForAndLeavesItsWorker) {
  LocalWorld world;
  RemoteModule stage = RemoteModule::create("a", "test.mlp", mlp(1));
  const c10::Dict<std::string, at::Tensor> state = stage.state_dict();
  ASSERT_GT(state.size(), 2u);
  const rpc::RRefPtr snapshot = snapshot_state(stage);
  snapshot->ready()->wait();
  const std::string take = "ferry.stage.take_snapshot_part";
  // One byte a part: one tensor a part, in the stage's order.
  const c10::IValue first = rpc::rpc_sync("a", take, {rpc::to_ivalue(snapshot), int64_t{1}});
  ASSERT_EQ(first.toGenericDict().size(), 1u);
  EXPECT_EQ(first.toGenericDict().begin()->key().toStringRef(), state.begin()->key());
  auto label = [](std::size_t) { return std::string("the stage"); };
  const rpc::ParkedTensors rest = rpc::bring_parks({snapshot}, take, 1, label).at(0);
  EXPECT_EQ(rest.size(), state.size() - 1);
  for (const auto& item : rest) EXPECT_TRUE(item.value().equal(state.at(item.key())));
  EXPECT_TRUE(bring_snapshots({snapshot}, label).at(0).empty());
}

// What a step checkpoint holds, of one stage, written without workers.
CheckpointContent content_of_step(int step) {
  c10::Dict<std::string, at::Tensor> state;
  state.insert("weight", torch::full({3}, static_cast<float>(step)));
  return CheckpointContent{{{"only", "test.mlp", "a", state}}, {{"step", int64_t{step}}}};
}

void change_file(const std::string& path, const std::function<void(std::string&)>& change) {
  std::string bytes = core::read_whole_file(path);
  change(bytes);
  core::write_file_atomically(path, bytes);
}

TEST(Checkpoint, AFileThatIsNotWhatItsManifestSaysIsNamedAndTheCheckpointBeforeItRead) {
  ferry::testing::TempDir dir("checkpoint");
  const std::string first = write_checkpoint(dir.path(), content_of_step(1), 3);
  const std::string second = write_checkpoint(dir.path(), content_of_step(2), 3);
  const std::string third = write_checkpoint(dir.path(), content_of_step(3), 3);
  // The newest's weights 3.0 changed to 4.0 (bytes that torch's own reader takes without a
  // word), the one before it cut short.
  change_file(third + "/only.pt", [](std::string& bytes) {
    const std::string three("\x00\x00\x40\x40\x00\x00\x40\x40", 8);
    const std::size_t at = bytes.find(three);
    ASSERT_NE(at, std::string::npos);
    bytes[at + 2] = '\x80';
  });
  change_file(second + "/step.pt", [](std::string& bytes) { bytes.resize(bytes.size() / 2); });

  std::vector<std::pair<std::string, std::string>> skipped;
  const SavedCheckpoint saved =
      read_latest_checkpoint(dir.path(), [&](const std::string& folder, const std::string& why) {
        skipped.emplace_back(folder, why);
      });
  EXPECT_EQ(saved.folder, first);
  EXPECT_EQ(saved.extra.at("step").toInt(), 1);
  EXPECT_TRUE(saved.stages.at(0).second.at("weight").equal(torch::full({3}, 1.0f)));
  EXPECT_THAT(skipped,
              ::testing::ElementsAre(
                  ::testing::Pair(
                      third, ::testing::HasSubstr("only.pt\" is corrupt: its bytes are not those")),
                  ::testing::Pair(second, ::testing::HasSubstr("step.pt\" is corrupt: it has"))));

  // None left: every folder and why.
  change_file(first + "/manifest.json", [](std::string& bytes) { bytes = "{"; });
  try {
    read_latest_checkpoint(dir.path());
    FAIL() << "a checkpoint was read where none is whole";
  } catch (const rpc::Error& e) {
    EXPECT_THAT(e.what(),
                ::testing::HasSubstr("no checkpoint in \"" + dir.path() + "\" could be read"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr(first + "/manifest.json\" is not a checkpoint"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("step.pt\" is corrupt"));
  }
}

}  // namespace
}  // namespace ferry::remote_module
