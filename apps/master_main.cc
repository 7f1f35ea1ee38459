// ferry-master: the training job (`train`), a look at a model's stages (`describe`, `footprint`),
// and the trained model out of Ferry (`export`, `predict`). Under a launcher (ferry-launch,
// torchrun, srun) every rank runs the same command: rank 0 is the master, every other rank serves
// as a worker. The flags are declared in master_flags.cc.
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include "apps/master_flags.h"
#include "ferry/core/message_of.h"
#include "ferry/trainer/worker_loop.h"

namespace {

// Runs the sub-command that was parsed; returns the exit code.
int run_command(const ferry::apps::MasterCommandLine& l) {
  if (*l.train_cmd) {
    if (const std::string given = ferry::apps::flags_a_plan_sets(l); !given.empty()) {
      std::cerr << "ferry-master train: --plan " << (l.train.plan_auto ? "auto" : l.train.plan_file)
                << " sets " << given << "; leave them out, or plan again with them\n";
      return 2;
    }
    return ferry::trainer::run_training(l.train);
  }
  if (*l.plan_cmd) return ferry::trainer::run_plan(l.plan);
  if (*l.export_cmd) return ferry::trainer::export_weights(l.export_settings);
  if (*l.predict_cmd) return ferry::trainer::run_prediction(l.predict);
  if (*l.footprint_cmd) {
    const ferry::trainer::PlanSettings& f = l.footprint;
    return ferry::trainer::measure_single_process(f.model, f.classes, f.image_size, f.batch_size,
                                                  f.optimizer, l.footprint_budget_mib);
  }
  return ferry::trainer::describe_model(l.describe, l.json, l.blocks);
}

}  // namespace

int main(int argc, char** argv) {
  ferry::apps::MasterCommandLine line;
  CLI11_PARSE(line.app, argc, argv);
  try {
    return run_command(line);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry-master: %s\n", ferry::core::message_of(e).c_str());
    return ferry::trainer::exit_code_of(std::current_exception(), 2);
  }
}
