#include "tests/support/training_runs.h"

#include <sys/wait.h>
#include <torch/serialize.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "ferry/core/files.h"
#include "ferry/core/processes.h"
#include "ferry/remote_module/checkpoint.h"
#include "tests/support/sanitizer_allowance.h"

namespace ferry::testing {

CommandResult run(const std::string& command) {
  const int limit_s = 240 * kSanitizerSlowdown;
  return core::run_command("timeout " + std::to_string(limit_s) + " " + command);
}

std::string learning_shortfall(const nlohmann::json& epochs) {
  if (epochs.empty()) return "no epochs";
  double best_iou = 0;
  for (const auto& epoch : epochs) best_iou = std::max(best_iou, epoch["val_iou"].get<double>());
  const double first = epochs.front()["train_loss"].get<double>();
  const double last = epochs.back()["train_loss"].get<double>();
  std::string shortfall;
  if (best_iou <= 0.45) shortfall += "best validation IoU " + std::to_string(best_iou) + "; ";
  if (last >= 0.6 * first) {
    shortfall += "training loss " + std::to_string(first) + " -> " + std::to_string(last) + "; ";
  }
  return shortfall;
}

std::vector<char> file_bytes(const std::string& path) {
  const std::string bytes = core::read_whole_file(path);
  return std::vector<char>(bytes.begin(), bytes.end());
}

std::vector<std::map<std::string, double>> read_metrics_csv(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<std::string> columns;
  if (!std::getline(in, line)) return {};
  for (std::istringstream header(line); std::getline(header, line, ',');) columns.push_back(line);
  std::vector<std::map<std::string, double>> rows;
  while (std::getline(in, line)) {
    std::map<std::string, double> row;
    std::istringstream cells(line + ",");
    std::string cell;
    for (const std::string& column : columns) {
      if (!std::getline(cells, cell, ',')) return {};
      row[column] = cell.empty() ? std::numeric_limits<double>::quiet_NaN() : std::stod(cell);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

bool parses_as_svg(const std::string& path) {
  return run("/usr/bin/python3 -c \"import sys, xml.etree.ElementTree as E; "
             "sys.exit(E.parse(sys.argv[1]).getroot().tag != "
             "'{http://www.w3.org/2000/svg}svg')\" " +
             path)
             .status == 0;
}

std::string latest_checkpoint(const std::string& dir) {
  return remote_module::latest_checkpoint_folder(dir);
}

std::string rewind_checkpoint(const std::string& dir) {
  const std::string newest = latest_checkpoint(dir);
  std::string previous;
  int previous_epoch = -1;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_directory() || entry.path().string() == newest) continue;
    if (!std::filesystem::exists(entry.path() / "epoch.pt")) continue;
    const int epoch =
        static_cast<int>(read_checkpoint(entry.path().string()).values.at("epoch").toInt());
    if (epoch > previous_epoch) {
      previous_epoch = epoch;
      previous = entry.path().string();
    }
  }
  if (previous.empty()) return "";
  // As a user would write it, with a newline.
  std::ofstream(dir + "/LATEST", std::ios::trunc)
      << std::filesystem::path(previous).filename().string() << "\n";
  return previous;
}

SavedCheckpoint read_checkpoint(const std::string& folder) {
  ferry::remote_module::SavedCheckpoint saved = ferry::remote_module::read_checkpoint(folder);
  SavedCheckpoint out;
  out.values = saved.extra;
  for (const auto& [stage, state] : saved.stages) {
    for (const auto& item : state) {
      out.tensors[item.key()] = item.value().to(at::kDouble);
      out.dtypes[item.key()] = item.value().scalar_type();
    }
  }
  return out;
}

double largest_relative_difference(const SavedCheckpoint& a, const SavedCheckpoint& b) {
  if (a.tensors.size() != b.tensors.size()) return std::numeric_limits<double>::infinity();
  double largest = 0;
  for (const auto& [name, tensor] : a.tensors) {
    auto other = b.tensors.find(name);
    if (other == b.tensors.end()) return std::numeric_limits<double>::infinity();
    double scale = std::max(other->second.norm().item<double>(), 1e-12);
    largest = std::max(largest, (tensor - other->second).norm().item<double>() / scale);
  }
  return largest;
}

double largest_absolute_difference(const SavedCheckpoint& a, const SavedCheckpoint& b) {
  if (a.tensors.size() != b.tensors.size()) return std::numeric_limits<double>::infinity();
  double largest = 0;
  for (const auto& [name, tensor] : a.tensors) {
    auto other = b.tensors.find(name);
    if (other == b.tensors.end()) return std::numeric_limits<double>::infinity();
    largest = std::max(largest, (tensor - other->second).abs().max().item<double>());
  }
  return largest;
}

std::vector<nlohmann::json> read_events(const std::string& path) {
  std::vector<nlohmann::json> events;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) events.push_back(nlohmann::json::parse(line));
  }
  return events;
}

}  // namespace ferry::testing
