// The master's side of a pipelined step without processes: the order each schedule lets
// micro-batches through, and the spans a step's recorded events become.
#include "pipeline/schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <deque>
#include <set>

#include "pipeline/stage_events.h"
#include "pipeline/wire.h"

namespace ferry::pipeline {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(Schedule, GPipeSendsEveryForwardThenEveryBackwardAfterTheLastOutput) {
  GPipeSchedule gpipe(4);
  EXPECT_THAT(gpipe.start(), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(gpipe.on_output(1), IsEmpty());
  EXPECT_THAT(gpipe.on_output(0), IsEmpty());
  EXPECT_THAT(gpipe.on_output(2), IsEmpty());
  EXPECT_THAT(gpipe.on_output(3), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(gpipe.on_backward_done(), std::nullopt);
}

TEST(Schedule, OneFOneBKeepsOneMicroBatchPerStageInFlight) {
  OneFOneBSchedule one(3, 5);
  EXPECT_THAT(one.start(), ElementsAre(0, 1, 2));
  EXPECT_THAT(one.on_output(0), ElementsAre(0));
  EXPECT_EQ(one.on_backward_done(), 3);
  EXPECT_THAT(one.on_output(1), ElementsAre(1));
  EXPECT_EQ(one.on_backward_done(), 4);
  EXPECT_EQ(one.on_backward_done(), std::nullopt);
  EXPECT_EQ(one.on_backward_done(), std::nullopt);
  // Fewer micro-batches than stages: all of them at once, as GPipe.
  OneFOneBSchedule few(4, 2);
  EXPECT_THAT(few.start(), ElementsAre(0, 1));
  EXPECT_EQ(few.on_backward_done(), std::nullopt);
}

// A step driven as Pipeline::step drives it, outputs and finished backwards arriving in order:
// every micro-batch goes forward once and backward once after its output, and 1F1B never has
// more than p in flight.
TEST(Schedule, EitherScheduleRunsEveryMicroBatchOnceAndBoundsWhatIsInFlight) {
  for (Schedule kind : {Schedule::GPipe, Schedule::OneFOneB}) {
    for (int p : {1, 2, 4}) {
      for (int m_count : {1, 3, 8}) {
        std::unique_ptr<MicrobatchSchedule> schedule = make_schedule(kind, p, m_count);
        std::deque<int> forwards, backwards;
        std::multiset<int> forwarded, backwarded, outputs;
        std::size_t most_in_flight = 0;
        auto send_forward = [&](int m) {
          forwarded.insert(m);
          forwards.push_back(m);
          most_in_flight = std::max(most_in_flight, forwarded.size() - backwarded.size());
        };
        for (int m : schedule->start()) send_forward(m);
        int done = 0;
        for (int guard = 0; done < m_count && guard < 1000; ++guard) {
          if (!forwards.empty()) {
            int m = forwards.front();
            forwards.pop_front();
            outputs.insert(m);
            for (int b : schedule->on_output(m)) {
              ASSERT_EQ(outputs.count(b), 1u) << "backward of " << b << " before its output";
              backwarded.insert(b);
              backwards.push_back(b);
            }
          } else {
            ASSERT_FALSE(backwards.empty()) << schedule_name(kind) << " stalled";
            backwards.pop_front();
            ++done;
            if (std::optional<int> next = schedule->on_backward_done()) send_forward(*next);
          }
        }
        const std::string where = std::string(schedule_name(kind)) + " p=" + std::to_string(p) +
                                  " M=" + std::to_string(m_count);
        EXPECT_EQ(done, m_count) << where;
        for (int m = 0; m < m_count; ++m) {
          EXPECT_EQ(forwarded.count(m), 1u) << where << " micro-batch " << m;
          EXPECT_EQ(backwarded.count(m), 1u) << where << " micro-batch " << m;
        }
        if (kind == Schedule::OneFOneB) {
          EXPECT_LE(most_in_flight, static_cast<std::size_t>(p)) << where;
        } else {
          EXPECT_EQ(most_in_flight, static_cast<std::size_t>(m_count)) << where;
        }
      }
    }
  }
}

at::Tensor rows(const std::vector<std::vector<std::int64_t>>& events) {
  at::Tensor t = at::empty({static_cast<std::int64_t>(events.size()), kEventFields}, at::kLong);
  for (size_t i = 0; i < events.size(); ++i) {
    for (int f = 0; f < kEventFields; ++f) t[i][f] = events[i][f];
  }
  return t;
}

// Two stages, one micro-batch forward: stage 1's clock runs 1000 ns ahead of the master's.
TEST(StageSpans, EventsBecomeSpansOnTheMastersClockAndArrivalsReceiveSpansFromTheirSend) {
  std::vector<at::Tensor> events = {
      rows({{kArriveForwardEvent, 0, 60, 60},
            {kForwardEvent, 0, 100, 200},
            {kSendForwardEvent, 0, 200, 210}}),
      rows({{kArriveForwardEvent, 0, 1215, 1215},
            {kForwardEvent, 0, 1220, 1300},
            {kArriveBackwardEvent, 0, 1500, 1500},
            {kBackwardEvent, 0, 1500, 1600}}),
  };
  std::vector<Span> spans = stage_spans(events, {0, 1000}, {50}, {480}, 7);
  auto has = [&](int track, SpanKind kind, double start_ns, double end_ns) {
    for (const Span& s : spans) {
      if (s.track == track && s.kind == kind && s.step == 7 && s.microbatch == 0 &&
          std::abs(s.start_s - start_ns * 1e-9) < 1e-12 &&
          std::abs(s.end_s - end_ns * 1e-9) < 1e-12) {
        return true;
      }
    }
    return false;
  };
  EXPECT_EQ(spans.size(), 7u);
  // Stage 0: its input left the master at 50 and arrived at 60.
  EXPECT_TRUE(has(Timeline::receive_track(0), SpanKind::Receive, 50, 60));
  EXPECT_TRUE(has(Timeline::compute_track(0), SpanKind::Forward, 100, 200));
  EXPECT_TRUE(has(Timeline::compute_track(0), SpanKind::Send, 200, 210));
  // Stage 1: sent by stage 0 at 200, arrived at 1215 - 1000.
  EXPECT_TRUE(has(Timeline::receive_track(1), SpanKind::Receive, 200, 215));
  EXPECT_TRUE(has(Timeline::compute_track(1), SpanKind::Forward, 220, 300));
  // The gradient left the master at 480 and arrived at 500.
  EXPECT_TRUE(has(Timeline::receive_track(1), SpanKind::Receive, 480, 500));
  EXPECT_TRUE(has(Timeline::compute_track(1), SpanKind::Backward, 500, 600));
}

TEST(StageSpans, AReceiveNeverStartsAfterItsArrival) {
  // The master's record of its send is later than the stage's arrival (clocks a little apart).
  std::vector<at::Tensor> events = {rows({{kArriveForwardEvent, 0, 40, 40}})};
  std::vector<Span> spans = stage_spans(events, {0}, {50}, {}, 0);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_DOUBLE_EQ(spans[0].start_s, spans[0].end_s);
}

}  // namespace
}  // namespace ferry::pipeline
