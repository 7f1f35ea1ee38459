#include "ferry/rpc/options.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "ferry/rpc/error.h"
#include "rpc/slurm_nodelist.h"
#include "tests/support/error_of.h"
#include "tests/support/temp_dir.h"

namespace ferry::rpc {
namespace {

using ferry::testing::error_of;
using ::testing::HasSubstr;

std::string init_error(const std::map<std::string, std::string>& env, Options options = {}) {
  try {
    resolve_options(options, env);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Init);
    return e.what();
  }
  return "no error";
}

TEST(Options, TakesTorchrunVariables) {
  Options o = resolve_options(
      {},
      {{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(o.rank, 2);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.master_addr, "10.1.2.3");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.name, "worker2");
}

TEST(Options, TakesSlurmVariablesWithTheFirstNodeAsMaster) {
  Options o = resolve_options({}, {{"SLURM_PROCID", "3"},
                                   {"SLURM_NTASKS", "8"},
                                   {"SLURM_NODELIST", "gpu[07-09,12],login1"},
                                   {"SLURM_JOB_ID", "123456"}});
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world_size, 8);
  EXPECT_EQ(o.master_addr, "gpu07");
  EXPECT_EQ(o.master_port, 20000 + 123456 % 20000);
}

TEST(Options, TakesOpenMpiVariables) {
  Options o = resolve_options({}, {{"OMPI_COMM_WORLD_RANK", "1"},
                                   {"OMPI_COMM_WORLD_SIZE", "2"},
                                   {"MASTER_ADDR", "head"},
                                   {"MASTER_PORT", "1234"}});
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.world_size, 2);
}

// `mpirun -np 4 ferry-master train ...` on one host needs no MASTER_ADDR or MASTER_PORT: every
// rank is local, and the port comes from the job id every rank shares.
TEST(Options, OpenMpiOnOneHostNeedsNoMasterSettings) {
  Options o = resolve_options({}, {{"OMPI_COMM_WORLD_RANK", "3"},
                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                   {"OMPI_MCA_ess_base_jobid", "1374093313"}});
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 20000 + 1374093313 % 20000);
  // Over several hosts the master's is not known.
  EXPECT_NE(init_error({{"OMPI_COMM_WORLD_RANK", "3"},
                        {"OMPI_COMM_WORLD_SIZE", "4"},
                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                        {"OMPI_MCA_ess_base_jobid", "1374093313"}})
                .find("master address is not set"),
            std::string::npos);
}

// A world on one machine whose rank 0 takes its port from the system: the other ranks read it from
// the file FERRY_MASTER_PORT_FILE names; without the file, port 0 is of no use to them.
TEST(Options, APortFileStandsForTheMasterPortOnEveryRank) {
  Options o = resolve_options({}, {{"RANK", "1"},
                                   {"WORLD_SIZE", "2"},
                                   {"MASTER_ADDR", "127.0.0.1"},
                                   {"FERRY_MASTER_PORT_FILE", "/run/world/port"}});
  EXPECT_EQ(o.master_port, 0);
  EXPECT_EQ(o.master_port_file, "/run/world/port");
  EXPECT_THAT(
      init_error(
          {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "0"}}),
      HasSubstr("rank 1: master port 0 is not usable: pass Options::master_port or set "
                "MASTER_PORT (0 lets rank 0 pick a free port, which the other ranks "
                "read from FERRY_MASTER_PORT_FILE)"));
}

TEST(Options, ExplicitOptionsWinOverTheEnvironment) {
  Options given;
  given.rank = 0;
  given.world_size = 1;
  given.name = "master";
  given.master_port = 0;
  Options o =
      resolve_options(given, {{"RANK", "5"}, {"WORLD_SIZE", "9"}, {"FERRY_IFNAME", "eth1"}});
  EXPECT_EQ(o.rank, 0);
  EXPECT_EQ(o.world_size, 1);
  EXPECT_EQ(o.name, "master");
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.ifname, "eth1");
}

TEST(Options, TheSecretComesFromTheOptionsAFileOrTheEnvironment) {
  const std::map<std::string, std::string> world = {
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}};
  std::string path = ferry::testing::process_temp_dir().file("options-secret");
  std::ofstream(path) << "from the file\n";  // one trailing newline, as echo leaves it
  ::chmod(path.c_str(), 0600);
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(world.begin(), world.end());
    return extra;
  };
  EXPECT_EQ(resolve_options({}, world).secret, "");
  EXPECT_EQ(resolve_options({}, with({{"FERRY_SECRET", "s"}})).secret, "s");
  EXPECT_EQ(resolve_options({}, with({{"FERRY_SECRET_FILE", path}})).secret, "from the file");
  Options from_file;
  from_file.secret_file = path;
  EXPECT_EQ(resolve_options(from_file, with({{"FERRY_SECRET", "s"}})).secret, "from the file");
  Options given;
  given.secret = "given";
  EXPECT_EQ(resolve_options(given, with({{"FERRY_SECRET", "s"}})).secret, "given");

  std::string missing = init_error(with({{"FERRY_SECRET_FILE", path + ".missing"}}));
  EXPECT_NE(missing.find("FERRY_SECRET_FILE: cannot read \"" + path + ".missing\""),
            std::string::npos)
      << missing;
  std::ofstream(path, std::ios::trunc) << "\n";
  std::string empty = init_error(with({{"FERRY_SECRET_FILE", path}}));
  EXPECT_NE(empty.find("is empty"), std::string::npos) << empty;
  std::remove(path.c_str());
}

TEST(Options, FirstSlurmHostHandlesEveryForm) {
  EXPECT_EQ(first_slurm_host("node1"), "node1");
  EXPECT_EQ(first_slurm_host("node1,node2"), "node1");
  EXPECT_EQ(first_slurm_host("node[3-5]"), "node3");
  EXPECT_EQ(first_slurm_host("node[03,07-09]"), "node03");
  EXPECT_EQ(first_slurm_host("a[1,2],b[3]"), "a1");
}

TEST(Options, MissingOrBadSettingsAreNamed) {
  EXPECT_NE(init_error({}).find("rank is not set"), std::string::npos);
  EXPECT_NE(init_error({{"RANK", "1"}}).find("world size is not set"), std::string::npos);
  EXPECT_NE(init_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}}).find("rank 4 is out of range"),
            std::string::npos);
  EXPECT_NE(init_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}}).find("master address is not set"),
            std::string::npos);
  EXPECT_THAT(init_error({{"RANK", "x1"}}),
              HasSubstr("RANK=\"x1\" is not a whole, non-negative number up to 2147483647"));
  EXPECT_THAT(init_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}),
              HasSubstr("WORLD_SIZE=\"0\" is not a whole, positive number"));
  EXPECT_THAT(init_error({{"RANK", "99999999999"}}), HasSubstr("RANK=\"99999999999\" is not"));
  EXPECT_NE(init_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}})
                .find("master port -1 is not usable"),
            std::string::npos);
}

}  // namespace
}  // namespace ferry::rpc
