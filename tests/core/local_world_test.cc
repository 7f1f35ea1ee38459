// A local world's port file: a folder of its own that nothing outlives, and the variables that
// point every rank at it.
#include "ferry/core/local_world.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace ferry::core {
namespace {

namespace fs = std::filesystem;

TEST(PortFile, LivesInAFolderOfItsOwnThatGoesWithItAndWhatRank0Wrote) {
  std::string folder;
  {
    const PortFile one, two;
    EXPECT_NE(one.path(), two.path());
    folder = fs::path(one.path()).parent_path().string();
    EXPECT_TRUE(fs::is_directory(folder));
    EXPECT_FALSE(fs::exists(one.path()));  // rank 0's store writes it
    std::ofstream(one.path()) << "41877\n";
    const auto env = loopback_world_env(2, 3, 0, one.path());
    EXPECT_EQ(env.at("MASTER_PORT"), "0");
    EXPECT_EQ(env.at("FERRY_MASTER_PORT_FILE"), one.path());
  }
  EXPECT_FALSE(fs::exists(folder));
}

}  // namespace
}  // namespace ferry::core
