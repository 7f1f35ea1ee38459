// `ferry-bench chaos`: a soak of the spares. A job of 2 replicas x 2 stages with spares runs
// under ferry-master, its workers started one by one; every `every` steps a worker that holds a
// stage, chosen at random, is SIGKILLed, `kills` times. A spare takes over from the last
// checkpoint (one every `checkpoint_every` steps) while there is one; when none is left the job
// fails, and the bench does what an elastic launcher does: it starts the whole world again, with
// fresh spares, resuming from the last checkpoint. It reports each
// kill (who, at which step, who recovered it and how, the steps trained again, the stall until
// training went on), whether the job ended normally, whether its last checkpoint exports
// and loads in Python, and how far its final weights are from those of the same job trained
// without a kill.
#pragma once

#include <string>

namespace ferry::bench {

struct ChaosBenchSettings {
  std::string model = "unet-resnet18";
  int image_size = 32;
  int samples = 80;  // images, a share of them for validation
  int batch = 8;
  int epochs = 30;
  int kills = 10;
  int every = 7;  // steps trained between one recovery and the next kill
  int spares = 2;
  int checkpoint_every = 2;    // optimizer steps between two checkpoints (and after each epoch)
  int seed = 1;                // which workers are killed
  double stall_limit_s = 240;  // a kill not recovered from within this is a hang: the soak stops
  bool unbroken = true;        // also train the job without kills, and compare the final weights
  std::string work_dir;        // checkpoints and logs; empty: a new folder in /tmp, removed after
  std::string self_path;
};

// Prints one JSON object last. Returns 0 when every kill was survived and the job completed.
int run_chaos_bench(const ChaosBenchSettings& settings);

}  // namespace ferry::bench
