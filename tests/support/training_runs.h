// Running Ferry's binaries from a test and reading what a training job left behind: its output
// and exit status, and the tensors of its checkpoints.
#pragma once

#include <ATen/core/ivalue.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ferry/core/processes.h"

namespace ferry::testing {

using CommandResult = core::CommandOutput;

// Runs a shell command, bounded by `timeout` (4 minutes, longer under sanitizers), and returns
// its exit status and output.
CommandResult run(const std::string& command);

std::vector<char> file_bytes(const std::string& path);

// The folder of the newest checkpoint in `dir` (what its LATEST names).
std::string latest_checkpoint(const std::string& dir);

// Makes the checkpoint saved before the latest one in `dir` the latest, as if the run had
// stopped one epoch earlier; returns its folder, empty if there is none.
std::string rewind_checkpoint(const std::string& dir);

// Every stage's tensors in a checkpoint folder by name (as float64, with the dtype they were
// saved in), and the values saved beside them ("epoch", "step", ...).
struct SavedCheckpoint {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, at::ScalarType> dtypes;
  std::map<std::string, c10::IValue> values;
};
SavedCheckpoint read_checkpoint(const std::string& folder);

// The rows of a --log-dir metrics.csv, each by column name (empty cells are NaN). Empty when the
// file is missing or malformed.
std::vector<std::map<std::string, double>> read_metrics_csv(const std::string& path);

// What a three-epoch run of the U-Net on the synthetic set must show in its --metrics-file's
// "epochs": a best validation IoU over 0.45 (predicting all foreground gives about 0.25; batch
// norm's running statistics make single epochs jumpy) and a last training loss under 0.6 of the
// first. Empty when it learned so; otherwise what fell short, with the figures.
std::string learning_shortfall(const nlohmann::json& epochs);

// Whether `path` is well-formed XML whose root is an <svg> element (read by Python's parser).
bool parses_as_svg(const std::string& path);

// The largest difference between same-named tensors, relative to the tensor's norm; infinite
// when the names differ.
double largest_relative_difference(const SavedCheckpoint& a, const SavedCheckpoint& b);
// The largest absolute difference of a tensor of `a` from the same tensor of `b`: 0 for the
// same weights bit by bit; infinity when their tensors' names differ.
double largest_absolute_difference(const SavedCheckpoint& a, const SavedCheckpoint& b);

// The lines of a --events file, in order; empty when it is missing.
std::vector<nlohmann::json> read_events(const std::string& path);

}  // namespace ferry::testing
