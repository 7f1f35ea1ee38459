// The blocks' measured costs kept on disk, so that a second plan, a resumed job or `train --plan
// auto` after `plan` does not measure them again. One file per model, classes and image size in
// the cache folder; it is used only when everything its figures depend on is the same (the sizes
// the blocks were timed at, the threads, the machine, Ferry's version), and measured anew and
// overwritten otherwise.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ferry/core/image_size.h"
#include "ferry/models/block_costs.h"
#include "trainer/planner.h"

namespace ferry::trainer {

// What cached costs depend on. Value type.
struct CostKey {
  std::string model;
  int64_t classes = 1;
  core::ImageSize image_size = 0;
  int64_t samples = 0, second_samples = 0;  // the sizes blocks are timed at
  int threads = 1;
  std::string machine;  // this_machine()
  std::string version;  // ferry_version()

  nlohmann::ordered_json json() const;
  bool operator==(const CostKey& other) const { return json() == other.json(); }
};

// The blocks' costs and the machine's, as the planner takes them. Value type.
struct CachedCosts {
  std::vector<models::BlockCost> blocks;
  MachineCosts machine;
};

// This host as the cache tells machines apart: its name, its CPU's model and its cores.
std::string this_machine();
// Ferry's version, as the project declares it.
std::string ferry_version();
// FERRY_CACHE_DIR, else $XDG_CACHE_HOME/ferry, else $HOME/.cache/ferry.
std::string default_cache_dir();

// The file that holds the costs for `key` in `dir`.
std::string cost_file(const std::string& dir, const CostKey& key);

// The costs saved for `key`, or nullopt if none are, or the file's were measured for another
// key. A file that cannot be read as costs is nullopt too (and measured anew), with a warning
// naming it.
std::optional<CachedCosts> load_costs(const std::string& dir, const CostKey& key);

// Writes the costs for `key` (atomically, creating `dir`). A failure to write is a warning: the
// plan goes on without the cache.
void save_costs(const std::string& dir, const CostKey& key, const CachedCosts& costs);

}  // namespace ferry::trainer
