// What a plan is scored from: the blocks' costs and the machine's (its cores, the link between
// two workers, an optimizer step per parameter), measured here once and kept in the block-cost
// cache under a key of the request and the cores. Used from one thread.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "ferry/trainer/plan_command.h"
#include "trainer/block_cost_cache.h"

namespace ferry::trainer {

// `cores`, or this machine's where it is 0.
int cores_of(int cores);

// The cache's key for `r`'s blocks measured for `cores` cores, at most `cores_per_worker` a
// worker.
CostKey key_of(const PlanRequest& r, int cores, int cores_per_worker);

// Where a plan's block costs are cached: the folder and what the key takes besides the request.
nlohmann::ordered_json costs_source(const std::string& cache_dir, int cores, int cores_per_worker);

// The costs from `cache_dir` (empty: default_cache_dir()) where it holds them for the key, else
// measured and cached there; says which on stderr.
CachedCosts costs_for(const PlanRequest& request, const std::string& cache_dir, int cores,
                      int cores_per_worker);

}  // namespace ferry::trainer
