// The timeline's data side (app/timeline_index.h) on a real recorded run, without a window: a
// 4-rank DDP run of the lab's Session, stepped by hand and indexed as the timeline view indexes it.
// Rows hold every event of their kind in time order, a time finds the span under it, an index
// extended frame by frame equals one built at once, and the frame's derived spans (bucket
// all-reduces, the collective in flight, overlap with backward) match the events.
#ifdef DTLAB_HAVE_GUI
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "app/session.h"
#include "app/timeline_index.h"
#include "tests/session_util.h"

using namespace dtlab;
using namespace dtlab::app;
using namespace dtlab::test;

namespace {

size_t count_kind(const std::vector<Event>& evs, EventKind k) {
  size_t n = 0;
  for (const Event& e : evs) n += e.kind == k;
  return n;
}

// Every span of a row names an event of `kind`, rows run in begin order and `reach` is the
// running maximum of the ends.
void check_row(const std::vector<RowSpan>& row, const std::vector<Event>& evs, EventKind kind, const EventClock& clk) {
  double reach = -1e300;
  for (size_t i = 0; i < row.size(); i++) {
    const RowSpan& sp = row[i];
    REQUIRE(sp.idx >= 0);
    REQUIRE(static_cast<size_t>(sp.idx) < evs.size());
    const Event& e = evs[static_cast<size_t>(sp.idx)];
    CHECK(e.kind == kind);
    CHECK(sp.b == clk.begin(e));
    if (i > 0) CHECK(row[i - 1].b <= sp.b);
    reach = std::max(reach, sp.e);
    CHECK(sp.reach == reach);
  }
}

// The same rows, span for span.
void check_same_rows(const RankRows& a, const RankRows& b) {
  CHECK(a.n == b.n);
  for (auto row : {&RankRows::compute, &RankRows::coll, &RankRows::ring, &RankRows::gate, &RankRows::grad_ready,
                   &RankRows::issues, &RankRows::launch_marks}) {
    REQUIRE((a.*row).size() == (b.*row).size());
    for (size_t i = 0; i < (a.*row).size(); i++) {
      CHECK((a.*row)[i].idx == (b.*row)[i].idx);
      CHECK((a.*row)[i].b == (b.*row)[i].b);
      CHECK((a.*row)[i].reach == (b.*row)[i].reach);
    }
  }
  REQUIRE(a.iters.size() == b.iters.size());
  for (size_t i = 0; i < a.iters.size(); i++) {
    CHECK(a.iters[i].iter == b.iters[i].iter);
    CHECK(a.iters[i].b == b.iters[i].b);
    CHECK(a.iters[i].e == b.iters[i].e);
    CHECK(a.iters[i].complete == b.iters[i].complete);
  }
  CHECK(a.backward.size() == b.backward.size());
  CHECK(a.launches.size() == b.launches.size());
  CHECK(a.bucket_allreduces.size() == b.bucket_allreduces.size());
  CHECK(a.ring_tail == b.ring_tail);
}

}  // namespace

TEST_SUITE("timeline") {
  TEST_CASE("timeline index: a stepped 4-rank DDP run in rows, found by time, extended as it grows") {
    Session s(lab_config(4));
    const EventClock modeled{true};
    TimelineIndex grown;  // updated at every step, as the view does every frame
    grown.update(step(s, GateKind::Iteration, 1).events, modeled);
    const Snapshot& a = step(s, GateKind::Iteration, 2);
    grown.update(a.events, modeled);
    TimelineIndex ix;
    ix.update(a.events, modeled);
    REQUIRE(ix.ranks.size() == 4);
    REQUIRE(grown.ranks.size() == 4);

    for (size_t r = 0; r < 4; r++) {
      CAPTURE(r);
      const std::vector<Event>& evs = a.events[r];
      const RankRows& rows = ix.ranks[r];
      CHECK(rows.n == evs.size());
      // Every event of a drawn kind is in its row, once.
      CHECK(rows.compute.size() == count_kind(evs, EventKind::Compute));
      CHECK(rows.coll.size() == count_kind(evs, EventKind::Collective));
      CHECK(rows.ring.size() == count_kind(evs, EventKind::RingStep));
      CHECK(rows.grad_ready.size() == count_kind(evs, EventKind::GradReady));
      CHECK(rows.launch_marks.size() == count_kind(evs, EventKind::BucketLaunch));
      CHECK(rows.launches.size() == count_kind(evs, EventKind::BucketLaunch));
      CHECK(rows.bucket_allreduces.size() == count_kind(evs, EventKind::BucketAllReduce));
      CHECK(rows.compute.size() > 10);
      CHECK(rows.coll.size() >= 3);  // the startup broadcast, then at least one all-reduce per iteration
      check_row(rows.compute, evs, EventKind::Compute, modeled);
      check_row(rows.coll, evs, EventKind::Collective, modeled);
      check_row(rows.ring, evs, EventKind::RingStep, modeled);
      // Three iterations stepped: 0 and 1 complete, each inside [t_min, t_max]; iterations in order.
      REQUIRE(rows.iters.size() >= 2);
      CHECK(rows.iters[0].iter == 0);
      CHECK(rows.iters[0].complete);
      CHECK(rows.iters[1].iter == 1);
      CHECK(rows.iters[1].complete);
      for (size_t i = 1; i < rows.iters.size(); i++) CHECK(rows.iters[i - 1].iter < rows.iters[i].iter);
      for (const IterExtent& it : rows.iters) {
        CHECK(it.b >= rows.t_min);
        CHECK(it.e <= rows.t_max);
      }
      // Backward windows: disjoint, in order, each covering layer-backward ops only.
      REQUIRE(!rows.backward.empty());
      for (size_t i = 1; i < rows.backward.size(); i++) CHECK(rows.backward[i - 1].e <= rows.backward[i].b);
      // The stepped run is at an iteration gate: no collective in flight.
      CHECK(rows.ring_tail.empty());
      // The index grown step by step holds what one built at once holds.
      check_same_rows(grown.ranks[r], rows);

      // A time finds the span under it: the middle of the longest compute op finds that op alone
      // (a rank's compute lane runs one op at a time), and a range before everything finds nothing.
      const RowSpan& mid = *std::max_element(rows.compute.begin(), rows.compute.end(),
                                             [](const RowSpan& x, const RowSpan& y) { return x.e - x.b < y.e - y.b; });
      REQUIRE(mid.e > mid.b);
      const double t = 0.5 * (mid.b + mid.e);
      const SpanRange at = visible_spans(rows.compute, t, t);
      REQUIRE(at.last - at.first == 1);
      CHECK(at.first->idx == mid.idx);
      const SpanRange before = visible_spans(rows.compute, rows.t_min - 2, rows.t_min - 1);
      CHECK(before.first == before.last);
      const SpanRange all = visible_spans(rows.compute, rows.t_min, rows.t_max);
      CHECK(static_cast<size_t>(all.last - all.first) == rows.compute.size());
      // Collectives by sequence number.
      for (const RowSpan& sp : rows.coll) {
        const uint64_t seq = evs[static_cast<size_t>(sp.idx)].coll.seq;
        if (const SeqIndex* l = find_seq(rows.launches, seq)) CHECK(evs[static_cast<size_t>(l->idx)].bucket.seq == seq);
      }
      CHECK(find_seq(rows.launches, 1u << 30) == nullptr);

      // The frame over the whole run: one bucket span per all-reduce DDP recorded, the overlap
      // inside both a bucket span and a backward window.
      FrameSpans d;
      derive_frame(rows, evs, modeled, rows.t_min, rows.t_max, d);
      CHECK(d.bucket.size() == rows.bucket_allreduces.size());
      CHECK(d.coll_tail.empty());
      for (const RowSpan& bk : d.bucket) CHECK(evs[static_cast<size_t>(bk.idx)].kind == EventKind::BucketAllReduce);
      for (const TimeInterval& o : d.overlap) {
        CHECK(o.e > o.b);
        bool in_bucket = false, in_backward = false;
        for (const RowSpan& bk : d.bucket) in_bucket = in_bucket || (o.b >= bk.b && o.e <= bk.e);
        for (const TimeInterval& w : rows.backward) in_backward = in_backward || (o.b >= w.b && o.e <= w.e);
        CHECK(in_bucket);
        CHECK(in_backward);
      }
    }

    // Follow: rank 0's last two iterations, to the end of everything recorded, with a margin.
    double t0 = 0, t1 = 0;
    ix.follow_range(t0, t1);
    const std::vector<IterExtent>& it0 = ix.iterations0();
    REQUIRE(it0.size() >= 2);
    CHECK(t0 < it0[it0.size() - 2].b);
    CHECK(t0 > it0[0].b - (it0.back().e - it0[0].b));
    CHECK(t1 > ix.t_max);
    // The overlap the step reports, by iteration; none for an iteration not run.
    REQUIRE(!a.history.empty());
    CHECK(overlap_of(a, static_cast<int32_t>(a.history[0].step - 1)) == a.history[0].overlap);
    CHECK(overlap_of(a, 1000) == -1);

    // The wall clock: the rows are rebuilt in its times.
    const EventClock wall{false};
    ix.update(a.events, wall);
    CHECK(!ix.ranks[0].modeled);
    check_row(ix.ranks[0].compute, a.events[0], EventKind::Compute, wall);
  }

  TEST_CASE("timeline index: the collective in flight, mid ring, is one hatched span with its bucket") {
    Session s(lab_config(4));
    step(s, GateKind::Collective, 2);                          // at the gate of #2, bucket 0's all-reduce
    const Snapshot& a = step(s, GateKind::RingStep, 3);        // start, then ring steps 0 and 1
    TimelineIndex ix;
    const EventClock modeled{true};
    ix.update(a.events, modeled);
    for (size_t r = 0; r < 4; r++) {
      CAPTURE(r);
      const RankRows& rows = ix.ranks[r];
      const std::vector<Event>& evs = a.events[r];
      CHECK(rows.ring_tail.size() == 2);
      FrameSpans d;
      derive_frame(rows, evs, modeled, rows.t_min, rows.t_max, d);
      REQUIRE(d.coll_tail.size() == 1);
      const RowSpan& tail = d.coll_tail[0];
      CHECK(tail.in_flight);
      CHECK(tail.steps_done == 2);
      // It names its collective's issue, #2, and the bucket it carries through that launch.
      const Event& issue = evs[static_cast<size_t>(tail.idx)];
      CHECK(issue.kind == EventKind::CollectiveIssue);
      CHECK(issue.coll.seq == 2);
      REQUIRE(!d.bucket.empty());
      const RowSpan& bk = d.bucket.back();
      CHECK(bk.in_flight);
      REQUIRE(bk.extra >= 0);
      CHECK(evs[static_cast<size_t>(bk.extra)].kind == EventKind::BucketLaunch);
      CHECK(evs[static_cast<size_t>(bk.extra)].bucket.seq == 2);
      // A range that ends before the ring steps began leaves the collective out.
      derive_frame(rows, evs, modeled, rows.t_min - 1, tail.b - 1e-12, d);
      CHECK(d.coll_tail.empty());
    }
  }
}

#endif  // DTLAB_HAVE_GUI
