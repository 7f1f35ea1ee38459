// A checkpoint's files as this layer writes and reads them: atomically, each pickled file with its
// size and BLAKE2b digest for the manifest, and read back checked against them. A failure is
// rpc::Error(InvalidArgument) naming the file. Safe from any thread (for different files).
#pragma once

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ferry::remote_module {

void write_atomically(const std::filesystem::path& path, const std::vector<char>& bytes);
std::vector<char> read_file(const std::filesystem::path& path);

struct Pickled {
  std::size_t bytes = 0;
  std::string blake2b;
};

// `value` pickled as torch.save does (the bytes of torch::pickle_save) straight into `path`,
// atomically, its digest taken as the bytes go.
Pickled write_pickled(const std::filesystem::path& path, const c10::IValue& value);

// `value` pickled into `folder`/`file`: the file's entry in the manifest.
nlohmann::ordered_json write_listed(const std::filesystem::path& folder, const std::string& file,
                                    const c10::IValue& value);

// The bytes of a file the manifest lists, checked against the size and digest it gives there
// (checkpoints written before digests give none).
std::vector<char> read_listed(const std::filesystem::path& folder, const nlohmann::json& entry);

}  // namespace ferry::remote_module
