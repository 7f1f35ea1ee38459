// Which collective backend a group of replicas uses (ferry/rpc/collective_group.h): NCCL for CUDA
// tensors where LibTorch has it, Gloo for everything else.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ferry/rpc/collective_group.h"
#include "ferry/rpc/error.h"
#include "tests/support/error_of.h"

namespace ferry::rpc {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(CollectiveBackend, CudaTensorsUseNcclWhereLibTorchHasIt) {
  EXPECT_EQ(collective_backend_for(c10::DeviceType::CUDA, true), CollectiveBackend::Nccl);
  EXPECT_EQ(collective_backend_for(c10::DeviceType::CUDA, false), CollectiveBackend::Gloo);
  EXPECT_EQ(collective_backend_for(c10::DeviceType::CPU, true), CollectiveBackend::Gloo);
  EXPECT_EQ(collective_backend_for(c10::DeviceType::CPU, false), CollectiveBackend::Gloo);
  EXPECT_STREQ(to_string(CollectiveBackend::Nccl), "nccl");
  EXPECT_STREQ(to_string(CollectiveBackend::Gloo), "gloo");
}

// Asked for where it is not built, NCCL is refused with the group's name, before anything waits
// for the other members.
TEST(CollectiveBackend, NcclWithoutItIsRefusedNamingTheGroup) {
  if (nccl_built()) {
    EXPECT_EQ(collective_backend_for(c10::DeviceType::CUDA, nccl_built()), CollectiveBackend::Nccl);
    return;
  }
  EXPECT_THAT(ferry::testing::kind_and_error_of(
                  [] { CollectiveGroup("replicas/stage1", 0, 2, CollectiveBackend::Nccl); }),
              AllOf(HasSubstr("InvalidArgument"), HasSubstr("\"replicas/stage1\" (member 0 of 2)"),
                    HasSubstr("no NCCL")));
}

}  // namespace
}  // namespace ferry::rpc
