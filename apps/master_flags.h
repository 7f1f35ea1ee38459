// ferry-master's command line: its sub-commands and their flags, each group of flags (the model,
// the cut, the optimizer, the secret, ...) declared once and shared by the sub-commands that take
// it. Every default shows in --help; a numeric value out of its range is a one-line error naming
// the flag. Kept apart from main so that tests parse command lines in-process.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>

#include "ferry/trainer/model_tools.h"
#include "ferry/trainer/plan_command.h"
#include "ferry/trainer/predict.h"
#include "ferry/trainer/settings.h"
#include "ferry/trainer/train.h"

namespace ferry::apps {

// Resource type: it owns the CLI11 app, whose options point into its settings.
struct MasterCommandLine {
  MasterCommandLine();
  MasterCommandLine(const MasterCommandLine&) = delete;
  MasterCommandLine& operator=(const MasterCommandLine&) = delete;

  CLI::App app{"Ferry master: trains a model split into stages on workers"};
  trainer::TrainSettings train;
  trainer::PlanSettings describe;
  bool json = false, blocks = false;  // describe --json, --blocks
  trainer::PlanSettings footprint;
  std::int64_t footprint_budget_mib = 0;
  trainer::ExportSettings export_settings;
  trainer::PredictSettings predict;
  trainer::PlanCommandSettings plan;
  CLI::App* train_cmd = nullptr;
  CLI::App* plan_cmd = nullptr;
  CLI::App* describe_cmd = nullptr;
  CLI::App* footprint_cmd = nullptr;
  CLI::App* export_cmd = nullptr;
  CLI::App* predict_cmd = nullptr;
};

// The flags a plan sets that were given beside `train --plan` (a plan file sets them all; auto
// leaves the model, the batch and the budget to them): an error names them. Empty: none.
std::string flags_a_plan_sets(const MasterCommandLine& line);

}  // namespace ferry::apps
