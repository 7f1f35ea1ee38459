#include "ferry/core/files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace ferry::core {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail_on(const std::string& what, const fs::path& path) {
  throw std::runtime_error(
      fmt::format("cannot {} \"{}\": {}", what, path.string(), std::strerror(errno)));
}

// A rename is durable only once the folder that holds the name is on disk too.
void sync_folder(const fs::path& folder) {
  int fd = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_file_atomically(const std::string& path, std::string_view bytes) {
  const fs::path target(path);
  fs::path tmp = target;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_on("write", tmp);
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = error;
      fail_on("write", tmp);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    errno = error;
    fail_on("flush to disk", tmp);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    errno = error;
    fail_on("rename into place", target);
  }
  sync_folder(target.parent_path());
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error(fmt::format("cannot read \"{}\": {}", path,
                                         errno ? std::strerror(errno) : "cannot open it"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error(fmt::format("cannot read \"{}\"", path));
  return text.str();
}

}  // namespace ferry::core
