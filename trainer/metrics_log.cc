#include "trainer/metrics_log.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "ferry/core/files.h"
#include "ferry/rpc/error.h"

namespace ferry::trainer {
namespace {

namespace fs = std::filesystem;

std::string header_of(const std::vector<std::string>& columns) {
  std::string header = "epoch";
  for (const std::string& column : columns) header += "," + column;
  return header;
}

// Empty cells are missing values, as pandas reads them.
std::string cell(double value) { return std::isfinite(value) ? fmt::format("{}", value) : ""; }

std::vector<std::string> split_line(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ',')) cells.push_back(cell);
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  return cells;
}

std::string xml_escaped(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// An axis from `lo` to `hi` in steps of 1, 2 or 5 times a power of ten, about five of them.
struct Axis {
  double lo = 0, hi = 1, step = 0.2;
};

Axis nice_axis(double lo, double hi) {
  if (!(hi > lo)) {
    double pad = std::max(std::abs(lo) * 0.1, 0.5);
    lo -= pad;
    hi += pad;
  }
  double raw = (hi - lo) / 5;
  double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double norm = raw / magnitude;
  double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * magnitude;
  return {std::floor(lo / step) * step, std::ceil(hi / step) * step, step};
}

constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                    "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
constexpr std::size_t kLegendColumns = 3;  // names a row above a panel; more rows go up
constexpr double kPanelWidth = 440, kHeight = 340;
constexpr double kLeft = 60, kRight = 20, kTop = 64, kBottom = 45;

std::string panel(double x0, const std::vector<std::string>& columns,
                  const std::vector<EpochFigures>& rows, const std::vector<std::string>& shown) {
  std::vector<std::pair<std::string, size_t>> series;
  for (const std::string& name : shown) {
    auto it = std::find(columns.begin(), columns.end(), name);
    if (it != columns.end()) series.emplace_back(name, it - columns.begin());
  }
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const EpochFigures& row : rows) {
    for (const auto& [name, index] : series) {
      if (std::isfinite(row.values[index])) {
        lo = std::min(lo, row.values[index]);
        hi = std::max(hi, row.values[index]);
      }
    }
  }
  const double width = kPanelWidth - kLeft - kRight, height = kHeight - kTop - kBottom;
  const double left = x0 + kLeft, bottom = kTop + height;
  std::string svg = fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#444\"/>\n", left,
      kTop, width, height);
  if (!std::isfinite(lo) || rows.empty()) {
    return svg +
           fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">no finite values</text>\n",
                       left + width / 2, kTop + height / 2);
  }
  const Axis y = nice_axis(lo, hi);
  const int first = rows.front().epoch, last = rows.back().epoch;
  const Axis x{first - (first == last ? 1.0 : 0.0), last + (first == last ? 1.0 : 0.0),
               std::max(1.0, std::ceil((last - first) / 10.0))};
  auto px = [&](double epoch) { return left + (epoch - x.lo) / (x.hi - x.lo) * width; };
  auto py = [&](double v) { return bottom - (v - y.lo) / (y.hi - y.lo) * height; };
  for (double v = y.lo; v <= y.hi + y.step / 2; v += y.step) {
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" font-size=\"11\">{:.4g}</text>\n",
        left, py(v), left + width, py(v), left - 6, py(v) + 4, v);
  }
  for (double e = std::ceil(x.lo); e <= x.hi; e += x.step) {
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"11\">{}</text>\n",
        px(e), bottom + 16, static_cast<int>(e));
  }
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">epoch</text>\n",
                     left + width / 2, bottom + 36);
  for (size_t k = 0; k < series.size(); ++k) {
    const char* colour = kColours[k % std::size(kColours)];
    std::string points;
    for (const EpochFigures& row : rows) {
      double v = row.values[series[k].second];
      if (!std::isfinite(v)) continue;
      points += fmt::format("{:.1f},{:.1f} ", px(row.epoch), py(v));
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n",
                         px(row.epoch), py(v), colour);
    }
    if (!points.empty()) points.pop_back();
    svg += fmt::format(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"{}\" font-size=\"12\">{}</text>\n",
        points, colour, left + 8 + 120 * (k % kLegendColumns),
        kTop - 8 - 14 * static_cast<double>(k / kLegendColumns), colour,
        xml_escaped(series[k].first));
  }
  return svg;
}

}  // namespace

std::string metrics_csv(const std::vector<std::string>& columns,
                        const std::vector<EpochFigures>& rows) {
  std::string text = header_of(columns) + "\n";
  for (const EpochFigures& row : rows) {
    text += std::to_string(row.epoch);
    for (double value : row.values) text += "," + cell(value);
    text += "\n";
  }
  return text;
}

namespace {

// Whether `cell` is one number and nothing after it; the number goes to `out`.
bool read_number(const std::string& cell, double* out) {
  try {
    size_t used = 0;
    *out = std::stod(cell, &used);
    return used == cell.size();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::vector<EpochFigures> parse_metrics_csv(const std::string& text,
                                            const std::vector<std::string>& columns) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != header_of(columns)) {
    rpc::refuse(fmt::format("its header is \"{}\", not \"{}\"", line, header_of(columns)));
  }
  std::vector<EpochFigures> rows;
  for (int number = 2; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    std::vector<std::string> cells = split_line(line);
    if (cells.size() != columns.size() + 1) {
      rpc::refuse(
          fmt::format("line {} has {} cells, not {}", number, cells.size(), columns.size() + 1));
    }
    EpochFigures row;
    double epoch = 0;
    bool numbers = read_number(cells[0], &epoch) && epoch == std::floor(epoch);
    row.epoch = static_cast<int>(epoch);
    for (size_t k = 1; k < cells.size() && numbers; ++k) {
      double value = std::nan("");
      numbers = cells[k].empty() || read_number(cells[k], &value);
      row.values.push_back(value);
    }
    if (!numbers) rpc::refuse(fmt::format("line {} is not numbers: \"{}\"", number, line));
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string metrics_svg(const std::string& title, const std::vector<std::string>& columns,
                        const std::vector<EpochFigures>& rows, const std::vector<std::string>& left,
                        const std::vector<std::string>& right) {
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"13\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"20\" text-anchor=\"middle\" font-size=\"15\">{3}</text>\n",
      2 * kPanelWidth, kHeight, kPanelWidth, xml_escaped(title));
  svg += panel(0, columns, rows, left);
  svg += panel(kPanelWidth, columns, rows, right);
  return svg + "</svg>\n";
}

MetricsLog::MetricsLog(std::string dir, std::vector<std::string> columns)
    : dir_(std::move(dir)), columns_(std::move(columns)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    rpc::refuse(fmt::format("cannot make log directory \"{}\": {}", dir_, ec.message()));
  }
}

std::string MetricsLog::csv_path() const { return (fs::path(dir_) / "metrics.csv").string(); }
std::string MetricsLog::plot_path() const { return (fs::path(dir_) / "metrics.svg").string(); }

std::string MetricsLog::resume_after(int epoch) {
  rows_.clear();
  if (!fs::exists(csv_path())) return fmt::format("{} was not there; it starts afresh", csv_path());
  try {
    rows_ = parse_metrics_csv(core::read_whole_file(csv_path()), columns_);
  } catch (const rpc::Error& e) {
    return fmt::format("{} is not this run's ({}); it starts afresh", csv_path(), e.what());
  }
  truncate_after(epoch);
  return "";
}

void MetricsLog::truncate_after(int epoch) {
  rows_.erase(std::remove_if(rows_.begin(), rows_.end(),
                             [&](const EpochFigures& row) { return row.epoch > epoch; }),
              rows_.end());
}

void MetricsLog::add(const EpochFigures& figures) {
  if (figures.values.size() != columns_.size()) {
    rpc::refuse(fmt::format("a metrics row of {} values for {} columns", figures.values.size(),
                            columns_.size()));
  }
  truncate_after(figures.epoch - 1);
  rows_.push_back(figures);
  core::write_file_atomically(csv_path(), metrics_csv(columns_, rows_));
}

namespace {

// The right panel: IoU and Dice with one class; with classes, the mIoU and each class's IoU.
std::vector<std::string> scores_shown(const std::vector<std::string>& columns) {
  std::vector<std::string> by_class;
  for (const std::string& name : columns) {
    if (name.rfind("val_iou_", 0) == 0) by_class.push_back(name);
  }
  if (by_class.empty()) return {"val_iou", "val_dice"};
  by_class.insert(by_class.begin(), "val_miou");
  return by_class;
}

}  // namespace

void MetricsLog::write_plot(const std::string& title) const {
  core::write_file_atomically(
      plot_path(),
      metrics_svg(title, columns_, rows_, {"train_loss", "val_loss"}, scores_shown(columns_)));
}

}  // namespace ferry::trainer
