// Files as every layer of Ferry writes and reads them: checkpoints, metrics, traces, exports.
// Safe from any thread (for different paths).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace ferry::core {

// Writes `bytes` to `path` so that, even across a crash, `path` holds either what it held before
// or all of `bytes`: a temporary file beside it, fsync, rename over `path`, fsync of the folder.
// Throws std::runtime_error naming the file and the system's reason.
void write_file_atomically(const std::string& path, std::string_view bytes);

// Where a writer hands its bytes, in order, as it makes them.
using ByteSink = std::function<void(const char* data, std::size_t size)>;
// The same, the bytes coming from `produce` through the sink it is given, so that they are never
// held whole in memory. Whatever `produce` throws is rethrown, and `path` keeps what it held.
void write_file_atomically(const std::string& path,
                           const std::function<void(const ByteSink&)>& produce);

// The whole of `path`, bytes as they are. Throws std::runtime_error naming the file if it cannot
// be read.
std::string read_whole_file(const std::string& path);

}  // namespace ferry::core
