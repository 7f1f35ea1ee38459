#include "pipeline/stage_events.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "pipeline/wire.h"

namespace ferry::pipeline {

std::vector<Span> stage_spans(const std::vector<at::Tensor>& events,
                              const std::vector<std::int64_t>& offsets_ns,
                              const std::vector<std::int64_t>& input_sent_ns,
                              const std::vector<std::int64_t>& grad_sent_ns, int step) {
  const int p = static_cast<int>(events.size());
  // When each arrival was sent, on the master's clock: (backward?, to stage, micro-batch).
  std::map<std::tuple<int, int, int>, std::int64_t> sends;
  for (int m = 0; m < static_cast<int>(input_sent_ns.size()); ++m)
    sends[{0, 0, m}] = input_sent_ns[m];
  for (int m = 0; m < static_cast<int>(grad_sent_ns.size()); ++m) {
    sends[{1, p - 1, m}] = grad_sent_ns[m];
  }
  for (int s = 0; s < p; ++s) {
    auto e = events[s].accessor<std::int64_t, 2>();
    for (std::int64_t i = 0; i < e.size(0); ++i) {
      const int m = static_cast<int>(e[i][1]);
      if (e[i][0] == kSendForwardEvent && s + 1 < p) {
        sends[{0, s + 1, m}] = e[i][2] - offsets_ns[s];
      } else if (e[i][0] == kSendBackwardEvent && s > 0) {
        sends[{1, s - 1, m}] = e[i][2] - offsets_ns[s];
      }
    }
  }
  std::vector<Span> spans;
  for (int s = 0; s < p; ++s) {
    auto e = events[s].accessor<std::int64_t, 2>();
    const int compute = Timeline::compute_track(s);
    for (std::int64_t i = 0; i < e.size(0); ++i) {
      const auto kind = static_cast<EventKind>(e[i][0]);
      const int m = static_cast<int>(e[i][1]);
      const double start = seconds(e[i][2] - offsets_ns[s]);
      const double end = seconds(e[i][3] - offsets_ns[s]);
      switch (kind) {
        case kForwardEvent:
          spans.push_back({compute, SpanKind::Forward, step, m, start, end});
          break;
        case kBackwardEvent:
          spans.push_back({compute, SpanKind::Backward, step, m, start, end});
          break;
        case kWeightEvent:
          spans.push_back({compute, SpanKind::Weight, step, m, start, end});
          break;
        case kSendForwardEvent:
        case kSendBackwardEvent:
          spans.push_back({compute, SpanKind::Send, step, m, start, end});
          break;
        case kArriveForwardEvent:
        case kArriveBackwardEvent: {
          auto sent = sends.find({kind == kArriveBackwardEvent ? 1 : 0, s, m});
          if (sent != sends.end()) {
            spans.push_back({Timeline::receive_track(s), SpanKind::Receive, step, m,
                             std::min(seconds(sent->second), end), end});
          }
          break;
        }
      }
    }
  }
  return spans;
}

}  // namespace ferry::pipeline
