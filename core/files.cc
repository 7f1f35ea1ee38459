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
  write_file_atomically(path, [bytes](const ByteSink& sink) { sink(bytes.data(), bytes.size()); });
}

void write_file_atomically(const std::string& path,
                           const std::function<void(const ByteSink&)>& produce) {
  const fs::path target(path);
  fs::path tmp = target;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_on("write", tmp);
  auto discard = [&] {
    if (fd < 0) return;
    ::close(fd);
    fd = -1;
    ::unlink(tmp.c_str());
  };
  // Discards the temporary file, then throws what went wrong with errno's reason.
  auto fail = [&](const char* what) {
    const int error = errno;
    discard();
    errno = error;
    fail_on(what, tmp);
  };
  const ByteSink sink = [&](const char* data, std::size_t size) {
    std::size_t done = 0;
    while (done < size) {
      ssize_t n = ::write(fd, data + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("write");
      done += static_cast<std::size_t>(n);
    }
  };
  try {
    produce(sink);
  } catch (...) {
    discard();
    throw;
  }
  if (::fsync(fd) != 0) fail("flush to disk");
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
