#include "ferry/pipeline/timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "ferry/core/files.h"

namespace ferry::pipeline {
namespace {

bool is_busy(SpanKind kind) {
  return kind == SpanKind::Forward || kind == SpanKind::Backward || kind == SpanKind::Weight ||
         kind == SpanKind::Send;
}

std::string span_name(const Span& span) {
  switch (span.kind) {
    case SpanKind::Forward:
      return fmt::format("F{}", span.microbatch);
    case SpanKind::Backward:
      return fmt::format("B{}", span.microbatch);
    case SpanKind::Weight:
      return fmt::format("W{}", span.microbatch);
    case SpanKind::Send:
      return fmt::format("send {}", span.microbatch);
    case SpanKind::Receive:
      return fmt::format("receive {}", span.microbatch);
    case SpanKind::Loss:
      return fmt::format("loss {}", span.microbatch);
    case SpanKind::Idle:
      return "idle";
  }
  return "?";
}

}  // namespace

const char* span_kind_name(SpanKind kind) {
  switch (kind) {
    case SpanKind::Forward:
      return "forward";
    case SpanKind::Backward:
      return "backward";
    case SpanKind::Send:
      return "send";
    case SpanKind::Receive:
      return "receive";
    case SpanKind::Idle:
      return "idle";
    case SpanKind::Loss:
      return "loss";
    case SpanKind::Weight:
      return "weight";
  }
  return "?";
}

Timeline::Timeline(std::string title, std::vector<std::string> stage_names, int microbatches)
    : title_(std::move(title)), stage_names_(std::move(stage_names)), microbatches_(microbatches) {}

void Timeline::add_step(std::vector<Span> spans, double start_s, double end_s) {
  if (first_start_s_ < 0) first_start_s_ = start_s;
  // A stage is idle wherever its compute track has nothing between the step's start and end.
  for (int s = 0; s < stage_count(); ++s) {
    std::vector<std::pair<double, double>> busy;
    for (const Span& span : spans) {
      if (span.track == compute_track(s) && is_busy(span.kind)) {
        busy.emplace_back(span.start_s, span.end_s);
      }
    }
    std::sort(busy.begin(), busy.end());
    double cursor = start_s;
    for (auto [from, to] : busy) {
      if (from > cursor)
        spans.push_back({compute_track(s), SpanKind::Idle, steps_, -1, cursor, from});
      cursor = std::max(cursor, to);
    }
    if (end_s > cursor)
      spans.push_back({compute_track(s), SpanKind::Idle, steps_, -1, cursor, end_s});
  }
  spans_.insert(spans_.end(), spans.begin(), spans.end());
  wall_s_ += end_s - start_s;
  ++steps_;
}

TimelineReport Timeline::report() const {
  TimelineReport report;
  report.steps = steps_;
  report.stages = stage_count();
  report.microbatches = microbatches_;
  report.wall_s = wall_s_;
  for (int s = 0; s < stage_count(); ++s) {
    StageReport stage;
    stage.name = stage_names_[s];
    for (const Span& span : spans_) {
      if (span.track != compute_track(s)) continue;
      double d = span.end_s - span.start_s;
      if (span.kind == SpanKind::Forward) stage.forward_s += d;
      if (span.kind == SpanKind::Backward) stage.backward_s += d;
      if (span.kind == SpanKind::Weight) stage.weight_s += d;
      if (span.kind == SpanKind::Send) stage.send_s += d;
    }
    double busy = stage.compute_s() + stage.send_s;
    stage.idle_s = std::max(0.0, wall_s_ - busy);
    stage.busy_share = wall_s_ > 0 ? std::min(1.0, busy / wall_s_) : 0;
    report.bubble += (1 - stage.busy_share) / stage_count();
    report.per_stage.push_back(stage);
  }
  int p = stage_count();
  report.ideal_bubble = static_cast<double>(p - 1) / (microbatches_ + p - 1);
  return report;
}

std::string Timeline::table() const {
  TimelineReport r = report();
  // The weight passes' column only where the schedule deferred them.
  const bool weights = std::any_of(r.per_stage.begin(), r.per_stage.end(),
                                   [](const StageReport& s) { return s.weight_s > 0; });
  std::string out = fmt::format("{:<40} {:>10} {:>10} ", "stage", "forward s", "backward s");
  if (weights) out += fmt::format("{:>10} ", "weight s");
  out += fmt::format("{:>8} {:>8} {:>6}\n", "send s", "idle s", "busy");
  for (const StageReport& s : r.per_stage) {
    out += fmt::format("{:<40} {:>10.2f} {:>10.2f} ", s.name, s.forward_s, s.backward_s);
    if (weights) out += fmt::format("{:>10.2f} ", s.weight_s);
    out += fmt::format("{:>8.2f} {:>8.2f} {:>5.0f}%\n", s.send_s, s.idle_s, 100 * s.busy_share);
  }
  out += fmt::format(
      "bubble over {} steps: measured {:.0f}% idle, ideal (p - 1) / (M + p - 1) = {:.0f}% "
      "(p = {}, M = {})\n",
      r.steps, 100 * r.bubble, 100 * r.ideal_bubble, r.stages, r.microbatches);
  return out;
}

void Timeline::write_chrome_trace(const std::string& path) const {
  nlohmann::json events = nlohmann::json::array();
  auto name_track = [&](int track, const std::string& name) {
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", 1},
                      {"tid", track},
                      {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", 1},
                      {"tid", track},
                      {"args", {{"sort_index", track}}}});
  };
  events.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"args", {{"name", title_}}}});
  name_track(0, "master");
  for (int s = 0; s < stage_count(); ++s) {
    name_track(compute_track(s), stage_names_[s]);
    name_track(receive_track(s), fmt::format("stage {} receives", s));
  }
  double origin = std::max(0.0, first_start_s_);
  for (const Span& span : spans_) {
    nlohmann::json args = {{"step", span.step}};
    if (span.microbatch >= 0) args["micro-batch"] = span.microbatch;
    events.push_back({{"ph", "X"},
                      {"name", span_name(span)},
                      {"cat", span_kind_name(span.kind)},
                      {"pid", 1},
                      {"tid", span.track},
                      {"ts", (span.start_s - origin) * 1e6},
                      {"dur", std::max(0.0, span.end_s - span.start_s) * 1e6},
                      {"args", args}});
  }
  try {
    core::write_file_atomically(
        path, nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n");
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("cannot write the trace: {}", e.what()));
  }
}

}  // namespace ferry::pipeline
