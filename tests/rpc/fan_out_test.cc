// The error taxonomy's pieces that need no agent: is_lost, OutOfMemory, the failure a fan-out
// reports and the one it picks, over futures completed by hand.
#include "ferry/rpc/fan_out.h"

#include <c10/util/Exception.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

namespace ferry::rpc {
namespace {

using ::testing::HasSubstr;

FuturePtr done_with(c10::IValue value) {
  auto f = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  f->markCompleted(std::move(value));
  return f;
}

FuturePtr failed_with(std::exception_ptr error) {
  auto f = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  f->setError(std::move(error));
  return f;
}

TEST(ErrorKinds, OnlyADeadOrSilentWorkerIsLost) {
  EXPECT_TRUE(is_lost(ErrorKind::PeerDied));
  EXPECT_TRUE(is_lost(Error(ErrorKind::Timeout, "late", "", "b")));
  for (ErrorKind kind : {ErrorKind::Init, ErrorKind::UnknownFunction, ErrorKind::RemoteException,
                         ErrorKind::BadFrame, ErrorKind::InvalidArgument, ErrorKind::Shutdown,
                         ErrorKind::OutOfMemory}) {
    EXPECT_FALSE(is_lost(kind)) << to_string(kind);
  }
}

TEST(ErrorKinds, ATensorThatDoesNotFitIsOutOfMemory) {
  try {
    C10_THROW_ERROR(OutOfMemoryError, "out of memory: 4.0 MiB asked for");
  } catch (...) {
    Failure failure = failure_of(std::current_exception());
    EXPECT_EQ(failure.kind, ErrorKind::OutOfMemory);
    EXPECT_THAT(failure.message, HasSubstr("4.0 MiB asked for"));
  }
  EXPECT_STREQ(to_string(ErrorKind::OutOfMemory), "OutOfMemory");
}

TEST(ErrorKinds, FirstFailurePrefersALostWorkerElseTheFirst) {
  auto boom = std::make_exception_ptr(std::runtime_error("boom"));
  auto died = std::make_exception_ptr(Error(ErrorKind::PeerDied, "b died", "", "b"));
  auto memory = std::make_exception_ptr(Error(ErrorKind::OutOfMemory, "full", "", "c"));
  EXPECT_EQ(first_failure({nullptr, boom, died}), died);
  EXPECT_EQ(first_failure({nullptr, memory, boom}), memory);
  EXPECT_EQ(first_failure({nullptr, nullptr}), nullptr);
}

TEST(FanOut, ReturnsEveryValueInCallOrder) {
  FanOut calls;
  calls.add(done_with(int64_t{1}), "a");
  calls.add(done_with(int64_t{2}), "b");
  std::vector<c10::IValue> values = calls.wait("sum");
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(values[0].toInt(), 1);
  EXPECT_EQ(values[1].toInt(), 2);
  EXPECT_TRUE(FanOut().wait().empty());
}

TEST(FanOut, NamesEveryFailureAndReportsALostWorkerBeforeAnEarlierFailure) {
  FanOut calls;
  calls.add(
      failed_with(std::make_exception_ptr(Error(
          ErrorKind::RemoteException, "call \"step\" on worker \"a\" raised: nan", "nan", "a"))),
      "a");
  calls.add(done_with(int64_t{2}), "b");
  calls.add(failed_with(std::make_exception_ptr(
                Error(ErrorKind::PeerDied, "worker \"c\" died during call \"step\"", "", "c"))),
            "c", "stage 2 on worker \"c\"");
  try {
    calls.wait("optimizer \"adam\": step");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::PeerDied);
    EXPECT_EQ(e.worker(), "c");
    EXPECT_STREQ(e.what(),
                 "optimizer \"adam\": step failed on worker \"a\": nan; stage 2 on worker \"c\": "
                 "worker \"c\" died during call \"step\"");
  }
}

TEST(FanOut, AFailureNamingNoWorkerIsTheCalledWorkers) {
  FanOut calls;
  calls.add(failed_with(std::make_exception_ptr(std::invalid_argument("bad shape"))), "b");
  try {
    calls.wait();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_EQ(e.worker(), "b");
    EXPECT_STREQ(e.what(), "on worker \"b\": bad shape");
  }
}

TEST(FanOut, WhenAllCompletesOnceEveryFutureHas) {
  auto first = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  auto second = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
  FuturePtr all = when_all({first, second});
  first->markCompleted(c10::IValue());
  EXPECT_FALSE(all->completed());
  second->setError(std::make_exception_ptr(std::runtime_error("x")));
  EXPECT_TRUE(all->completed());
  EXPECT_FALSE(all->hasError());
  EXPECT_TRUE(when_all({})->completed());
}

}  // namespace
}  // namespace ferry::rpc
