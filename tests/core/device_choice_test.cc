// Which GPU a worker takes (ferry/core/device_choice.h), for each launcher's variables.
#include "ferry/core/device_choice.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>

#include "tests/support/error_of.h"

namespace ferry::core {
namespace {

using ferry::testing::error_of;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Env = std::map<std::string, std::string>;

std::string device(const std::string& requested, const Env& env, std::int64_t visible) {
  return choose_device(requested, env, visible).device;
}

TEST(DeviceChoice, EachLaunchersLocalRankPicksItsGpu) {
  // torchrun, srun (one task per GPU of a 4-GPU node) and mpirun.
  EXPECT_EQ(device("auto", {{"LOCAL_RANK", "2"}}, 4), "cuda:2");
  EXPECT_EQ(device("auto", {{"SLURM_LOCALID", "3"}}, 4), "cuda:3");
  EXPECT_EQ(device("auto", {{"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}, 4), "cuda:1");
  // A master and four workers on four GPUs: the fifth task wraps round to the first.
  EXPECT_EQ(device("auto", {{"SLURM_LOCALID", "4"}}, 4), "cuda:0");
  // torchrun's variable wins where srun's is also set (torchrun started under srun).
  EXPECT_EQ(device("auto", {{"LOCAL_RANK", "1"}, {"SLURM_LOCALID", "0"}}, 4), "cuda:1");
  EXPECT_EQ(device("auto", {}, 4), "cuda:0");
  EXPECT_EQ(device("cuda", {{"LOCAL_RANK", "5"}}, 2), "cuda:1");
  EXPECT_THAT(choose_device("auto", {{"LOCAL_RANK", "5"}}, 4).reason,
              AllOf(HasSubstr("LOCAL_RANK=5"), HasSubstr("4 visible")));
}

TEST(DeviceChoice, CudaVisibleDevicesNumbersTheDevicesFromZero) {
  // srun --gpu-bind or a scheduler gives each task one device: every rank sees it as cuda:0.
  const Env one{{"SLURM_LOCALID", "3"}, {"CUDA_VISIBLE_DEVICES", "3"}};
  EXPECT_EQ(device("auto", one, 1), "cuda:0");
  EXPECT_EQ(device("cuda:0", one, 1), "cuda:0");
  EXPECT_THAT(error_of([&] { device("cuda:3", one, 1); }),
              AllOf(HasSubstr("--device cuda:3"), HasSubstr("1 CUDA device is visible"),
                    HasSubstr("CUDA_VISIBLE_DEVICES=\"3\""), HasSubstr("cuda:0 to cuda:0")));
  // Without it, every device of the machine is visible.
  EXPECT_EQ(device("cuda:3", {}, 4), "cuda:3");
  EXPECT_THAT(error_of([&] { device("cuda:4", {}, 4); }),
              AllOf(HasSubstr("4 CUDA devices are visible"), HasSubstr("cuda:0 to cuda:3")));
}

TEST(DeviceChoice, WithoutAGpuAutoIsTheCpuAndCudaIsAnError) {
  EXPECT_EQ(device("auto", {{"LOCAL_RANK", "1"}}, 0), "cpu");
  EXPECT_EQ(device("cpu", {{"LOCAL_RANK", "1"}}, 4), "cpu");
  EXPECT_THAT(error_of([] { device("cuda", {}, 0); }),
              HasSubstr("--device cuda: 0 CUDA devices are visible"));
  EXPECT_THAT(error_of([] {
                device("cuda", {{"CUDA_VISIBLE_DEVICES", ""}}, 0);
              }),
              HasSubstr("CUDA_VISIBLE_DEVICES=\"\""));
}

TEST(DeviceChoice, BadRequestsAndRanksAreNamed) {
  EXPECT_THAT(error_of([] { device("gpu", {}, 4); }),
              AllOf(HasSubstr("\"gpu\""), HasSubstr("auto, cpu, cuda and cuda:N")));
  EXPECT_THAT(error_of([] { device("cuda:x", {}, 4); }), HasSubstr("\"cuda:x\": the device index"));
  EXPECT_THAT(error_of([] { device("cuda:-1", {}, 4); }), HasSubstr("\"cuda:-1\""));
  EXPECT_THAT(error_of([] {
                device("auto", {{"LOCAL_RANK", "one"}}, 4);
              }),
              HasSubstr("LOCAL_RANK=\"one\""));
  // An empty variable is an unset one.
  EXPECT_EQ(device("auto", {{"LOCAL_RANK", ""}, {"SLURM_LOCALID", "2"}}, 4), "cuda:2");
}

}  // namespace
}  // namespace ferry::core
