// Files as every layer of Ferry writes and reads them: checkpoints, metrics, traces, exports.
// Safe from any thread (for different paths).
#pragma once

#include <string>
#include <string_view>

namespace ferry::core {

// Writes `bytes` to `path` so that, even across a crash, `path` holds either what it held before
// or all of `bytes`: a temporary file beside it, fsync, rename over `path`, fsync of the folder.
// Throws std::runtime_error naming the file and the system's reason.
void write_file_atomically(const std::string& path, std::string_view bytes);

// The whole of `path`, bytes as they are. Throws std::runtime_error naming the file if it cannot
// be read.
std::string read_whole_file(const std::string& path);

}  // namespace ferry::core
