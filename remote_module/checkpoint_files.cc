#include "remote_module/checkpoint_files.h"

#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <sodium.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "ferry/core/files.h"
#include "ferry/rpc/error.h"

namespace ferry::remote_module {
namespace {

namespace fs = std::filesystem;

// A file's BLAKE2b digest in hex, taken as its bytes go by: what the manifest holds of each file,
// so that a read finds a file that the disk or a hand changed (torch's own reader checks no sums).
class Digest {
 public:
  Digest() {
    if (sodium_init() < 0) rpc::refuse("libsodium could not start");
    crypto_generichash_init(&state_, nullptr, 0, crypto_generichash_BYTES);
  }
  void add(const void* data, std::size_t size) {
    crypto_generichash_update(&state_, static_cast<const unsigned char*>(data), size);
  }
  std::string hex() {
    unsigned char hash[crypto_generichash_BYTES];
    crypto_generichash_final(&state_, hash, sizeof hash);
    char out[2 * crypto_generichash_BYTES + 1];
    sodium_bin2hex(out, sizeof out, hash, sizeof hash);
    return out;
  }

 private:
  crypto_generichash_state state_;
};

std::string digest(const std::vector<char>& bytes) {
  Digest d;
  d.add(bytes.data(), bytes.size());
  return d.hex();
}

}  // namespace

void write_atomically(const fs::path& path, const std::vector<char>& bytes) {
  try {
    core::write_file_atomically(path.string(), std::string_view(bytes.data(), bytes.size()));
  } catch (const std::runtime_error& e) {
    rpc::refuse(e.what());
  }
}

std::vector<char> read_file(const fs::path& path) {
  try {
    const std::string bytes = core::read_whole_file(path.string());
    return std::vector<char>(bytes.begin(), bytes.end());
  } catch (const std::runtime_error& e) {
    rpc::refuse(e.what());
  }
}

// No copy of the file is held whole in memory, which for a stage of hundreds of MiB is most of the
// write's time.
Pickled write_pickled(const fs::path& path, const c10::IValue& value) {
  Digest hash;
  std::size_t size = 0;
  try {
    core::write_file_atomically(path.string(), [&](const core::ByteSink& sink) {
      std::vector<char> pickled;
      torch::jit::Pickler pickler([&pickled](const char* data, std::size_t n) {
        pickled.insert(pickled.end(), data, data + n);
      });
      pickler.protocol();
      pickler.pushIValue(value);
      pickler.stop();
      // The archive's writer calls back from inside its zip library: a failure there is kept
      // and rethrown here, not thrown through it.
      std::exception_ptr failed;
      caffe2::serialize::PyTorchStreamWriter archive([&](const void* data, std::size_t n) {
        if (failed) return std::size_t{0};
        try {
          sink(static_cast<const char*>(data), n);
        } catch (...) {
          failed = std::current_exception();
          return std::size_t{0};
        }
        hash.add(data, n);
        size += n;
        return n;
      });
      try {
        torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(),
                                           pickler.tensorData(), archive);
        archive.writeEndOfFile();
      } catch (...) {
        if (failed) std::rethrow_exception(failed);
        throw;
      }
      if (failed) std::rethrow_exception(failed);
    });
  } catch (const std::runtime_error& e) {
    rpc::refuse(e.what());
  }
  return {size, hash.hex()};
}

nlohmann::ordered_json write_listed(const fs::path& folder, const std::string& file,
                                    const c10::IValue& value) {
  const Pickled written = write_pickled(folder / file, value);
  return {{"file", file}, {"bytes", written.bytes}, {"blake2b", written.blake2b}};
}

std::vector<char> read_listed(const fs::path& folder, const nlohmann::json& entry) {
  const fs::path path = folder / entry.at("file").get<std::string>();
  std::vector<char> bytes = read_file(path);
  if (entry.contains("bytes") && entry.at("bytes").get<std::size_t>() != bytes.size()) {
    rpc::refuse(fmt::format("\"{}\" is corrupt: it has {} bytes where the manifest says {}",
                            path.string(), bytes.size(), entry.at("bytes").get<std::size_t>()));
  }
  if (entry.contains("blake2b") && entry.at("blake2b").get<std::string>() != digest(bytes)) {
    rpc::refuse(
        fmt::format("\"{}\" is corrupt: its bytes are not those the manifest's digest "
                    "was taken of",
                    path.string()));
  }
  return bytes;
}

}  // namespace ferry::remote_module
