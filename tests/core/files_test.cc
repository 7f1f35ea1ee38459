// core's files and polling wait, without processes: what every file Ferry writes goes through.
#include "ferry/core/files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "ferry/core/backoff.h"
#include "tests/support/temp_dir.h"

namespace ferry::core {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(Files, AnAtomicWriteLeavesTheWholeFileAndNoTemporaryBesideIt) {
  testing::TempDir dir("files");
  const std::string path = dir.file("metrics.json");
  write_file_atomically(path, "first");
  write_file_atomically(path, std::string("second\0with a zero", 18));
  EXPECT_EQ(read_whole_file(path), std::string("second\0with a zero", 18));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(names, ::testing::ElementsAre("metrics.json"));
}

TEST(Files, AStreamedWriteKeepsItsPiecesInOrderAndAFailedOneLeavesTheOldContent) {
  testing::TempDir dir("files");
  const std::string path = dir.file("stage0.pt");
  write_file_atomically(path, "before");
  write_file_atomically(path, [](const ByteSink& sink) {
    for (const char* piece : {"one ", "two ", "three"}) sink(piece, std::strlen(piece));
  });
  EXPECT_EQ(read_whole_file(path), "one two three");
  auto fails_midway = [](const ByteSink& sink) {
    sink("half of it", 10);
    throw std::runtime_error("the pickler gave up");
  };
  try {
    write_file_atomically(path, fails_midway);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "the pickler gave up");
  }
  EXPECT_EQ(read_whole_file(path), "one two three");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(names, ::testing::ElementsAre("stage0.pt"));
}

TEST(Files, AnEmptyWriteMakesAnEmptyFile) {
  testing::TempDir dir("files");
  write_file_atomically(dir.file("empty"), "");
  EXPECT_EQ(read_whole_file(dir.file("empty")), "");
}

TEST(Files, AWriteIntoAMissingFolderNamesTheFileAndLeavesTheOldContent) {
  testing::TempDir dir("files");
  try {
    write_file_atomically(dir.file("no/such/folder/out.json"), "x");
    FAIL() << "nothing was thrown";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr(dir.file("no/such/folder/out.json")));
    EXPECT_THAT(e.what(), HasSubstr("No such file or directory"));
  }
}

TEST(Files, AMissingFileIsAnErrorNamingIt) {
  testing::TempDir dir("files");
  try {
    read_whole_file(dir.file("absent"));
    FAIL() << "nothing was thrown";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot read \"" + dir.file("absent") + "\""));
  }
}

TEST(Backoff, ReturnsAsSoonAsTheConditionHolds) {
  int looks = 0;
  EXPECT_TRUE(poll_with_backoff([&] { return ++looks == 3; },
                                std::chrono::steady_clock::now() + std::chrono::minutes(1)));
  EXPECT_EQ(looks, 3);
}

TEST(Backoff, GivesUpAtTheDeadlineAfterALastLook) {
  int looks = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(30);
  EXPECT_FALSE(poll_with_backoff(
      [&] {
        ++looks;
        return false;
      },
      deadline));
  EXPECT_GE(std::chrono::steady_clock::now(), deadline);
  EXPECT_GE(looks, 2);
}

TEST(Backoff, ALookThatHoldsAtTheDeadlineStillCounts) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
  EXPECT_TRUE(
      poll_with_backoff([&] { return std::chrono::steady_clock::now() >= deadline; }, deadline));
}

}  // namespace
}  // namespace ferry::core
