// ferry-master's commands on a model outside a training job: `describe` (its stages, their sizes
// and estimates), `footprint` (the whole model's training step in one process) and `export` (a
// trained model out of its checkpoint, as one state dict that Python's
// segmentation_models_pytorch loads: `smp.Unet(...).load_state_dict(torch.load(path))`).
#pragma once

#include <cstdint>
#include <string>

#include "ferry/core/image_size.h"
#include "ferry/trainer/settings.h"

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
                           Optimizer optimizer, int64_t memory_budget_mib = 0);

// Runs `master_program footprint` (ferry-master's) as a fresh process, so that nothing of this
// one counts, for the model, image size, batch and optimizer of `plan`; returns the peak memory
// it reports, or -1.
double single_process_peak_mib(const std::string& master_program, const PlanSettings& plan);

struct ExportSettings {
  std::string checkpoint_dir;
  int epoch = 0;  // 0: the latest checkpoint
  std::string out;
};

// Writes the chosen checkpoint's stages as one state dict to `out` and says what it wrote; and
// beside it, in about_path(out), a JSON object of the smp model to load it into ("model"), how
// its inputs were normalised in training ("normalize": {"mean": [3], "std": [3]}) and the size
// they were brought to ("input": {"height", "width", "resize"}), for predict and for Python.
// Returns the exit code.
int export_weights(const ExportSettings& settings);

}  // namespace ferry::trainer
