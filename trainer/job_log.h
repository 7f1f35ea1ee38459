// What a training job's output says of its course, read back by a program that watches the job
// from outside (ferry-bench chaos, an elastic launcher): how far it has trained, which spares
// took over which lost workers, and how often it went back to a checkpoint (value functions).
// The lines it reads are the progress bar's when the output is not a terminal, and the
// takeover's warnings (trainer/train.cc).
#pragma once

#include <string>
#include <vector>

namespace ferry::trainer {

struct Takeover {
  std::string lost;
  std::string spare;
};

struct JobCourse {
  int epoch = 0;  // of the last progress line; 0: none yet
  int step = 0;
  int steps_per_epoch = 0;
  long global_step = 0;  // steps of every epoch before `epoch`, plus `step`
  long progress_lines = 0;
  std::vector<Takeover> takeovers;  // in the order they happened
  int went_back = 0;                // times training went back to a checkpoint after a loss
};

JobCourse read_job_course(const std::string& output);

}  // namespace ferry::trainer
