// The run's figures per epoch as files to look at: DIR/metrics.csv, one row per epoch (as
// Lightning's CSVLogger writes them), and DIR/metrics.svg, the loss and IoU curves. Resource type,
// used from the master's thread. No LibTorch.
#pragma once

#include <string>
#include <vector>

namespace ferry::trainer {

// One epoch's figures, in the order of the log's columns after "epoch".
struct EpochFigures {
  int epoch = 0;
  std::vector<double> values;
};

class MetricsLog {
 public:
  // Creates `dir` if needed. Columns: "epoch", then `columns`. The file is written whole after
  // every add(), so a run that dies leaves every finished epoch's row. Throws
  // rpc::Error(InvalidArgument) naming the directory when it cannot be made.
  MetricsLog(std::string dir, std::vector<std::string> columns);

  // A resumed run keeps the rows of the epochs up to `epoch` that DIR/metrics.csv already holds,
  // if its header is this log's; returns a sentence saying why not otherwise ("" when kept).
  std::string resume_after(int epoch);
  // Forgets the rows after `epoch` (a run that went back to a checkpoint).
  void truncate_after(int epoch);
  // Adds or replaces the row of `figures.epoch` and writes metrics.csv. Throws
  // rpc::Error(InvalidArgument) for a row of the wrong width, and core's std::runtime_error
  // naming the file when it cannot be written.
  void add(const EpochFigures& figures);
  // Writes metrics.svg: the train and validation loss, and the validation IoU and Dice, by epoch.
  void write_plot(const std::string& title) const;

  std::string csv_path() const;
  std::string plot_path() const;
  const std::vector<EpochFigures>& rows() const { return rows_; }

 private:
  std::string dir_;
  std::vector<std::string> columns_;
  std::vector<EpochFigures> rows_;  // by epoch, rising
};

// The CSV text of `rows` under the header "epoch,<columns>".
std::string metrics_csv(const std::vector<std::string>& columns,
                        const std::vector<EpochFigures>& rows);
// Parses metrics_csv's text back; throws rpc::Error(InvalidArgument) naming the line that is
// wrong.
std::vector<EpochFigures> parse_metrics_csv(const std::string& text,
                                            const std::vector<std::string>& columns);
// An SVG of two panels side by side: the curves of `left` and of `right` (column names) against
// the epoch. Points that are not finite are left out; a panel without points says so.
std::string metrics_svg(const std::string& title, const std::vector<std::string>& columns,
                        const std::vector<EpochFigures>& rows, const std::vector<std::string>& left,
                        const std::vector<std::string>& right);

}  // namespace ferry::trainer
