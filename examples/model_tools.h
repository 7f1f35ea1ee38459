// ferry-master's looks at a model without a world: `describe` (its stages, their sizes and
// estimates) and `footprint` (the whole model's training step in one process).
#pragma once

#include <cstdint>
#include <string>

#include "examples/stage_plan.h"

namespace ferry::examples {

// Prints the plan's stages with their parameters, buffers, bytes, output shapes (for one image of
// `settings.image_size`) and estimated peak and step time, as a table or one JSON object; with
// `blocks`, every block's measured costs too.
int describe_model(const PlanSettings& settings, bool json, bool blocks);

// One training step (forward, backward, a step of `optimizer`) of the whole model in this process;
// prints its peak memory (MiB) as the last line. What the split saves is measured against this.
int measure_single_process(const std::string& model, int64_t classes, int64_t image_size,
                           int64_t batch_size, const std::string& optimizer);

// Runs `ferry-master footprint` as a fresh process (so nothing of this one counts) and returns
// the peak memory it reports, or -1.
double single_process_peak_mib(const std::string& model, int64_t classes, int64_t image_size,
                               int64_t batch_size, const std::string& optimizer);

}  // namespace ferry::examples
