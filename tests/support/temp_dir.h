// The one way tests get a folder of their own: made fresh under the system's temporary folder
// (mkdtemp, so two tests or two runs never share one), and removed with all it holds when the
// object goes, whether the test passed or not.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace ferry::testing {

// Resource type.
class TempDir {
 public:
  // `what` names the folder ("ferry-<what>-XXXXXX") for whoever finds it while the test runs.
  explicit TempDir(const std::string& what) {
    std::string pattern =
        (std::filesystem::temp_directory_path() / ("ferry-" + what + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("cannot make a temporary folder like " + pattern);
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // `name` inside the folder.
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// This test process's own folder, made on first use and removed when the process exits: for the
// files a test shares with the processes it starts, by path. (Each test runs in a process of its
// own under ctest.)
inline const TempDir& process_temp_dir() {
  static const TempDir dir("test");
  return dir;
}

}  // namespace ferry::testing
