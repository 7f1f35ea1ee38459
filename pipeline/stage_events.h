// What the stages recorded in one step, as spans on the master's clock. Private to pipeline/.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "ferry/pipeline/timeline.h"

namespace ferry::pipeline {

// Step `step`'s spans of every stage, from the rows each stage's worker recorded (`events[s]`:
// one row per event of wire.h, times on that worker's steady clock). Compute and send spans go
// on the stage's compute track; an arrival becomes a receive span on its receive track, from
// when its sender sent it (at the latest its arrival). `offsets_ns[s]`: stage s's clock less the
// master's. `input_sent_ns[m]` and `grad_sent_ns[m]`: when the master sent micro-batch m's input
// to the first stage and its gradient to the last.
std::vector<Span> stage_spans(const std::vector<at::Tensor>& events,
                              const std::vector<std::int64_t>& offsets_ns,
                              const std::vector<std::int64_t>& input_sent_ns,
                              const std::vector<std::int64_t>& grad_sent_ns, int step);

}  // namespace ferry::pipeline
