// ferry-master: the training job (`train`), a look at a model's stages (`describe`, `footprint`),
// and the trained model out of Ferry (`export`, `predict`). Under a launcher (ferry-launch,
// torchrun, srun) every rank runs the same command: rank 0 is the master, every other rank serves
// as a worker. The flags are declared in master_flags.cc.
#include <cstdio>
#include <exception>

#include "apps/master_flags.h"
#include "ferry/core/message_of.h"
#include "ferry/trainer/worker_loop.h"

int main(int argc, char** argv) {
  ferry::apps::MasterCommandLine line;
  CLI11_PARSE(line.app, argc, argv);
  try {
    return ferry::apps::run_master_command(line);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-master: %s\n", ferry::core::message_of(e).c_str());
    return ferry::trainer::exit_code_of(std::current_exception(), 2);
  }
}
