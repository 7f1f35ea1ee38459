// What the stages of a pipeline did, and when: spans on one clock (the master's), one track per
// stage, gathered step by step. Written as a Chrome trace (the JSON trace-event format that
// Perfetto and chrome://tracing open) and summarised as each stage's busy share and the measured
// bubble against the ideal one of its schedule.
//
// Thread rules: a Timeline is used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::pipeline {

// Weight: a turn of the deferred weight passes of the zero-bubble schedule (Backward is then the
// input pass alone).
enum class SpanKind { Forward, Backward, Send, Receive, Idle, Loss, Weight };
const char* span_kind_name(SpanKind kind);

struct Span {
  int track = 0;  // 0 the master, then each stage's compute track, then its receive track
  SpanKind kind = SpanKind::Forward;
  int step = 0;
  int microbatch = -1;  // -1 for spans of no micro-batch (idle)
  double start_s = 0;   // seconds on the master's steady clock
  double end_s = 0;
};

// One stage's share of the recorded steps. Busy is forward + backward + weight + send; idle is the
// rest of each step's wall time.
struct StageReport {
  std::string name;
  double forward_s = 0;
  double backward_s = 0;
  double weight_s = 0;
  double send_s = 0;
  double idle_s = 0;
  double busy_share = 0;
  // What the stage computed: forward, backward and weight passes.
  double compute_s() const { return forward_s + backward_s + weight_s; }
};

struct TimelineReport {
  int steps = 0;
  int stages = 0;
  int microbatches = 0;
  double wall_s = 0;  // all recorded steps
  std::vector<StageReport> per_stage;
  double bubble = 0;        // mean idle share of the stages
  double ideal_bubble = 0;  // (p - 1) / (M + p - 1)
};

class Timeline {
 public:
  // `stage_names` label the tracks ("stage 0: unet.encoder on worker1").
  Timeline(std::string title, std::vector<std::string> stage_names, int microbatches);

  int stage_count() const { return static_cast<int>(stage_names_.size()); }
  static int compute_track(int stage) { return 1 + 2 * stage; }
  static int receive_track(int stage) { return 2 + 2 * stage; }

  // Adds one step's spans (compute, send and receive spans of every stage, the master's) and
  // the idle gaps of each stage's compute track within [start_s, end_s].
  void add_step(std::vector<Span> spans, double start_s, double end_s);

  const std::vector<Span>& spans() const { return spans_; }
  int steps() const { return steps_; }
  TimelineReport report() const;
  // The report as the table a training run ends with.
  std::string table() const;
  // Throws std::runtime_error naming `path` if it cannot be written.
  void write_chrome_trace(const std::string& path) const;

 private:
  std::string title_;
  std::vector<std::string> stage_names_;
  int microbatches_;
  std::vector<Span> spans_;
  int steps_ = 0;
  double wall_s_ = 0;
  double first_start_s_ = -1;
};

}  // namespace ferry::pipeline
