// ferry-master's looks at a model without a world: `describe` (its stages, their sizes and
// estimates) and `footprint` (the whole model's training step in one process).
#pragma once

#include <cstdint>
#include <string>

#include "ferry/trainer/stage_plan.h"

namespace ferry::trainer {

// Prints the plan's stages with their parameters, buffers, bytes, output shapes (for one image of
// `settings.image_size`) and estimated peak and step time, as a table or one JSON object; with
// `blocks`, every block's measured costs too.
int describe_model(const PlanSettings& settings, bool json, bool blocks);

// One training step (forward, backward, a step of `optimizer`) of the whole model in this process;
// prints its peaks as the last line, {"peak_rss_mib", "peak_tensor_mib"} (tensor memory as the
// allocator counts it). What the split saves is measured against this. With a budget (MiB, 0:
// none), a step that does not fit it throws c10::OutOfMemoryError.
int measure_single_process(const std::string& model, int64_t classes,
                           const core::ImageSize& image_size, int64_t batch_size,
                           const std::string& optimizer, int64_t memory_budget_mib = 0);

// Runs `master_program footprint` (ferry-master's) as a fresh process, so that nothing of this
// one counts, for the model, image size, batch and optimizer of `plan`; returns the peak memory
// it reports, or -1.
double single_process_peak_mib(const std::string& master_program, const PlanSettings& plan);

}  // namespace ferry::trainer
