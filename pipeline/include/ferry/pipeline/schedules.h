// The schedules a pipelined step runs under, by name (ferry/pipeline/pipeline.h says what each
// costs). No LibTorch, so that settings can name one without its headers.
#pragma once

#include <string>

#include "ferry/core/enum_names.h"

namespace ferry::pipeline {

enum class Schedule { GPipe, OneFOneB, ZeroBubble };
// "gpipe", "1f1b", "zb".
const core::EnumNames<Schedule>& schedule_names();
std::string schedule_name(Schedule schedule);

}  // namespace ferry::pipeline
