// The timeline's data side, apart from its drawing (as Tracy keeps its Worker apart from its View):
// per rank, rows of spans built from the snapshot's events (compute ops, collectives, ring steps,
// stepper gates, instants) and the iterations' extents, kept between frames and extended with the
// new events only; then, for the range one frame shows, what it derives (bucket all-reduces, the
// collective in flight, overlap with backward). No ImGui or GL here: app/views/timeline_view.cpp
// draws from it, tests/test_timeline_index.cpp checks it.
#pragma once
#include <algorithm>
#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "app/snapshot.h"

namespace dtlab::app {

// Both clocks as seconds: the cost model's (modeled) or this machine's threads' (wall).
struct EventClock {
  bool modeled = true;
  double begin(const Event& e) const { return modeled ? e.model_begin : static_cast<double>(e.wall_begin_ns) * 1e-9; }
  double end(const Event& e) const { return modeled ? e.model_end : static_cast<double>(e.wall_end_ns) * 1e-9; }
};

// One span of a row (an instant has b == e).
struct RowSpan {
  double b = 0, e = 0;
  double reach = 0;        // the furthest end of this span and every earlier one in its row
  int32_t idx = -1;        // the event: s.events[rank][idx]
  int32_t extra = -1;      // bucket spans made from a collective: the BucketLaunch naming the bucket
  int16_t steps_done = 0;  // the collective in flight: ring steps finished
  bool in_flight = false;
};
struct TimeInterval { double b, e; };
struct IterExtent { int32_t iter; double b, e; bool complete; };
struct SeqIndex { uint64_t seq; int32_t idx; };

// One rank's rows. The Session only appends events (and drops whole old iterations from the
// front), so extend() scans only what is new; rows stay sorted by begin, and culling is a binary
// search (visible_spans).
struct RankRows {
  // What was scanned: events [0, n) of a window whose first and n-th events were these.
  size_t n = 0;
  uint64_t front_order = 0, back_order = 0;
  int64_t front_wall = 0, back_wall = 0;
  bool modeled = true;
  std::vector<RowSpan> compute, coll, ring, gate, grad_ready, issues, launch_marks;
  std::vector<RowSpan> loss_scale;  // fp16 GradScaler decisions (instants; `scaler`)
  std::vector<SeqIndex> launches, bucket_allreduces;  // by collective seq
  std::vector<TimeInterval> backward;  // windows of consecutive layer-backward ops: what DDP overlaps with
  bool in_backward = false;
  std::vector<int32_t> ring_tail;  // ring steps since the last finished collective: the one in flight
  std::vector<IterExtent> iters;   // finished ones from their Iteration events, the running one from its events
  double frontier[2] = {-DBL_MAX, -DBL_MAX};  // where each lane's recorded work ends (compute, comm)
  double t_min = DBL_MAX, t_max = -DBL_MAX;
  bool unsorted = false;

  void reset(bool clock_modeled);  // keeps the capacity: a rescan happens every iteration
  // Brings the rows up to date with `evs` (the rank's window): appends what is new, or rescans
  // when the front was trimmed, a new run began or the clock changed.
  void extend(const std::vector<Event>& evs, const EventClock& clk);
};

// Every rank's rows, and the range all of them cover.
struct TimelineIndex {
  std::vector<RankRows> ranks;
  double t_min = DBL_MAX, t_max = -DBL_MAX;

  void update(const std::vector<std::vector<Event>>& events, const EventClock& clk);
  // What "follow" shows: rank 0's last two iterations to the end of everything recorded, with a
  // margin (2% before, 8% after).
  void follow_range(double& t0, double& t1) const;
  const std::vector<IterExtent>& iterations0() const;  // rank 0's, or none
};

// The spans of a row that reach into [t0, t1].
struct SpanRange {
  const RowSpan* first;
  const RowSpan* last;
};
inline SpanRange visible_spans(const std::vector<RowSpan>& row, double t0, double t1) {
  const RowSpan* b = row.data();
  const RowSpan* e = b + row.size();
  const RowSpan* first = std::partition_point(b, e, [t0](const RowSpan& sp) { return sp.reach < t0; });
  return {first, std::partition_point(first, e, [t1](const RowSpan& sp) { return sp.b <= t1; })};
}

inline const SeqIndex* find_seq(const std::vector<SeqIndex>& v, uint64_t seq) {
  auto it = std::lower_bound(v.begin(), v.end(), seq, [](const SeqIndex& x, uint64_t s) { return x.seq < s; });
  return it != v.end() && it->seq == seq ? &*it : nullptr;
}

// What one frame draws for a rank beyond its rows: bucket all-reduces (their own events, or, while
// backward still runs and DDP has not recorded them yet, their collective with the launch that
// names the bucket), the collective in flight, and the overlap with backward.
struct FrameSpans {
  std::vector<RowSpan> bucket, coll_tail;  // coll_tail: the in-flight collective, drawn after the row
  std::vector<TimeInterval> overlap;
};
// Fills `d` (its capacity kept between frames) for [t0, t1].
void derive_frame(const RankRows& c, const std::vector<Event>& evs, const EventClock& clk, double t0, double t1, FrameSpans& d);

// The overlap DDP reported for iteration `iter` (StepPoint.step = iteration + 1); -1 when none.
double overlap_of(const Snapshot& s, int32_t iter);

}  // namespace dtlab::app
