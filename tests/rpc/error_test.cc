// rpc::Error's kind, cause and worker through the helpers that restate and rethrow it.
#include "ferry/rpc/error.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

namespace ferry::rpc {
namespace {

using ::testing::HasSubstr;

TEST(Error, RestatedKeepsTheKindAndTheWorkerAndDropsTheCause) {
  Error died(ErrorKind::PeerDied, "call \"f\" on worker \"b\" failed: gone", "gone", "b");
  Error said = died.restated("restoring stage \"s\": " + std::string(died.what()));
  EXPECT_EQ(said.kind(), ErrorKind::PeerDied);
  EXPECT_EQ(said.worker(), "b");
  EXPECT_EQ(said.cause(), "");
  EXPECT_STREQ(said.what(), "restoring stage \"s\": call \"f\" on worker \"b\" failed: gone");
}

TEST(Error, RethrowAsKeepsKindCauseAndWorkerAndPrefersTheWorkersOwnWords) {
  try {
    rethrow_as(std::make_exception_ptr(
                   Error(ErrorKind::Timeout, "call \"f\" to worker \"c\" timed out", "", "c")),
               "pipeline step failed");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Timeout);
    EXPECT_EQ(e.worker(), "c");
    EXPECT_STREQ(e.what(), "pipeline step failed: call \"f\" to worker \"c\" timed out");
  }
  try {
    rethrow_as(
        std::make_exception_ptr(Error(ErrorKind::RemoteException,
                                      "call \"f\" on worker \"a\" raised: boom", "boom", "a")),
        "building stage 2");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::RemoteException);
    EXPECT_EQ(e.worker(), "a");
    EXPECT_EQ(e.cause(), "boom");
    EXPECT_STREQ(e.what(), "building stage 2: boom");
  }
}

TEST(Error, RethrowAsMakesAnyOtherExceptionARemoteExceptionOfNoWorker) {
  try {
    rethrow_as(std::make_exception_ptr(std::out_of_range("index 7")), "reading the batch");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::RemoteException);
    EXPECT_EQ(e.worker(), "");
    EXPECT_THAT(e.what(), HasSubstr("reading the batch: index 7"));
  }
}

}  // namespace
}  // namespace ferry::rpc
