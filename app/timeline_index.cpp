// The timeline's rows of spans, per rank (timeline_index.h).
#include "app/timeline_index.h"

#include <algorithm>

namespace dtlab::app {

namespace {

void add_to_iteration(std::vector<IterExtent>& iters, const Event& e, double b, double en) {
  if (e.iteration < 0) return;
  const bool whole = e.kind == EventKind::Iteration;
  for (auto it = iters.rbegin(); it != iters.rend(); ++it) {
    if (it->iter != e.iteration) continue;
    if (whole) *it = {e.iteration, b, en, true};
    else if (!it->complete) it->b = std::min(it->b, b), it->e = std::max(it->e, en);
    return;
  }
  iters.push_back({e.iteration, b, en, whole});
}

void push_span(RankRows& c, std::vector<RowSpan>& row, double b, double e, size_t idx) {
  if (!row.empty() && b < row.back().b) c.unsorted = true;
  RowSpan sp;
  sp.b = b, sp.e = e, sp.idx = static_cast<int32_t>(idx);
  sp.reach = row.empty() ? e : std::max(row.back().reach, e);
  row.push_back(sp);
}

void push_seq(RankRows& c, std::vector<SeqIndex>& v, uint64_t seq, size_t idx) {
  if (!v.empty() && seq < v.back().seq) c.unsorted = true;
  v.push_back({seq, static_cast<int32_t>(idx)});
}

// Files event i in the rows it belongs to.
void add_event(RankRows& c, const Event& e, size_t i, double b, double en) {
  switch (e.kind) {
    case EventKind::Compute:
      c.frontier[0] = std::max(c.frontier[0], en);
      // A checkpointed block's recompute runs inside backward.
      if (e.compute.kind == ComputeKind::LayerBackward || e.compute.kind == ComputeKind::Recompute) {
        if (!c.in_backward) c.backward.push_back({b, en}), c.in_backward = true;
        else c.backward.back().e = std::max(c.backward.back().e, en);
      } else {
        c.in_backward = false;
      }
      push_span(c, c.compute, b, en, i);
      break;
    case EventKind::GradReady: push_span(c, c.grad_ready, b, b, i); break;
    case EventKind::LossScale: push_span(c, c.loss_scale, b, b, i); break;
    case EventKind::CollectiveIssue: push_span(c, c.issues, b, b, i); break;
    case EventKind::BucketLaunch:
      push_span(c, c.launch_marks, b, b, i);
      push_seq(c, c.launches, e.bucket.seq, i);
      break;
    case EventKind::Collective:
      c.frontier[1] = std::max(c.frontier[1], en);
      c.ring_tail.clear();  // the comm worker is serial: the steps so far belonged to finished ops
      push_span(c, c.coll, b, en, i);
      break;
    case EventKind::RingStep:
      c.frontier[1] = std::max(c.frontier[1], en);
      c.ring_tail.push_back(static_cast<int32_t>(i));
      push_span(c, c.ring, b, en, i);
      break;
    case EventKind::BucketAllReduce: push_seq(c, c.bucket_allreduces, e.bucket.seq, i); break;
    case EventKind::Gate: push_span(c, c.gate, b, en, i); break;
    default: break;
  }
}

// Rows out of order: not expected from the engine; stay correct if it ever happens.
void sort_rows(RankRows& c) {
  for (auto* row : {&c.compute, &c.coll, &c.ring, &c.gate, &c.grad_ready, &c.issues, &c.launch_marks, &c.loss_scale}) {
    std::stable_sort(row->begin(), row->end(), [](const RowSpan& x, const RowSpan& y) { return x.b < y.b; });
    for (size_t i = 0; i < row->size(); i++) (*row)[i].reach = std::max((*row)[i].e, i ? (*row)[i - 1].reach : -DBL_MAX);
  }
  for (auto* v : {&c.launches, &c.bucket_allreduces})
    std::stable_sort(v->begin(), v->end(), [](const SeqIndex& x, const SeqIndex& y) { return x.seq < y.seq; });
  c.unsorted = false;
}

}  // namespace

void RankRows::reset(bool clock_modeled) {
  n = 0;
  modeled = clock_modeled;
  for (auto* row : {&compute, &coll, &ring, &gate, &grad_ready, &issues, &launch_marks, &loss_scale}) row->clear();
  launches.clear(), bucket_allreduces.clear(), backward.clear(), ring_tail.clear(), iters.clear();
  in_backward = unsorted = false;
  frontier[0] = frontier[1] = -DBL_MAX;
  t_min = DBL_MAX, t_max = -DBL_MAX;
}

void RankRows::extend(const std::vector<Event>& evs, const EventClock& clk) {
  const size_t count = evs.size();
  const bool same = n > 0 && count >= n && modeled == clk.modeled && evs[0].order == front_order &&
                    evs[0].wall_begin_ns == front_wall && evs[n - 1].order == back_order && evs[n - 1].wall_end_ns == back_wall;
  if (!same) reset(clk.modeled);  // the front was trimmed, a new run began or the clock changed
  if (count == n) return;
  for (size_t i = n; i < count; i++) {
    const Event& e = evs[i];
    const double b = clk.begin(e), en = clk.end(e);
    t_min = std::min(t_min, b), t_max = std::max(t_max, en);
    add_to_iteration(iters, e, b, en);
    add_event(*this, e, i, b, en);
  }
  if (unsorted) sort_rows(*this);
  if (!std::is_sorted(iters.begin(), iters.end(), [](const IterExtent& x, const IterExtent& y) { return x.iter < y.iter; }))
    std::sort(iters.begin(), iters.end(), [](const IterExtent& x, const IterExtent& y) { return x.iter < y.iter; });
  n = count;
  front_order = evs[0].order, front_wall = evs[0].wall_begin_ns;
  back_order = evs[count - 1].order, back_wall = evs[count - 1].wall_end_ns;
}

void TimelineIndex::update(const std::vector<std::vector<Event>>& events, const EventClock& clk) {
  if (ranks.size() != events.size()) ranks.assign(events.size(), RankRows{});
  t_min = DBL_MAX, t_max = -DBL_MAX;
  for (size_t r = 0; r < events.size(); r++) {
    RankRows& c = ranks[r];
    c.extend(events[r], clk);
    t_min = std::min(t_min, c.t_min), t_max = std::max(t_max, c.t_max);
  }
}

const std::vector<IterExtent>& TimelineIndex::iterations0() const {
  static const std::vector<IterExtent> kNone;
  return ranks.empty() ? kNone : ranks[0].iters;
}

void TimelineIndex::follow_range(double& t0, double& t1) const {
  const std::vector<IterExtent>& iters0 = iterations0();
  double b = 0, e = 1e-3;
  if (!iters0.empty()) {
    b = iters0.size() >= 2 ? iters0[iters0.size() - 2].b : iters0.back().b;
    e = std::max(t_max, iters0.back().e);
  } else if (t_max > t_min) {
    b = t_min, e = t_max;
  }
  const double span = std::max(e - b, 1e-9);
  t0 = b - 0.02 * span, t1 = e + 0.08 * span;
}

void derive_frame(const RankRows& c, const std::vector<Event>& evs, const EventClock& clk, double t0, double t1, FrameSpans& d) {
  d.bucket.clear(), d.coll_tail.clear(), d.overlap.clear();
  const SpanRange cr = visible_spans(c.coll, t0, t1);
  for (const RowSpan* sp = cr.first; sp < cr.last; ++sp) {
    const Event& ce = evs[static_cast<size_t>(sp->idx)];
    if (ce.coll.group != 0) continue;  // buckets are the world's all-reduces; a group counts its own
    const uint64_t seq = ce.coll.seq;
    RowSpan bk = *sp;
    if (const SeqIndex* ba = find_seq(c.bucket_allreduces, seq)) bk.idx = ba->idx;
    else if (const SeqIndex* l = find_seq(c.launches, seq)) bk.extra = l->idx;
    else continue;
    d.bucket.push_back(bk);
  }
  if (!c.ring_tail.empty()) {  // the collective in flight: its ring steps so far, as one span
    RowSpan sp;
    sp.b = DBL_MAX, sp.e = -DBL_MAX, sp.in_flight = true;
    for (int32_t i : c.ring_tail) {
      const Event& r = evs[static_cast<size_t>(i)];
      sp.b = std::min(sp.b, clk.begin(r)), sp.e = std::max(sp.e, clk.end(r));
      sp.steps_done = std::max<int16_t>(sp.steps_done, static_cast<int16_t>(r.step.step + 1));
    }
    const uint64_t seq = evs[static_cast<size_t>(c.ring_tail.back())].step.seq;
    const int32_t group = evs[static_cast<size_t>(c.ring_tail.back())].step.group;
    sp.idx = c.ring_tail.back();
    for (auto it = c.issues.rbegin(); it != c.issues.rend(); ++it)
      if (evs[static_cast<size_t>(it->idx)].coll.seq == seq && evs[static_cast<size_t>(it->idx)].coll.group == group) {
        sp.idx = it->idx;
        break;
      }
    sp.reach = sp.e;
    if (sp.e >= t0 && sp.b <= t1) {
      d.coll_tail.push_back(sp);
      if (const SeqIndex* l = group == 0 ? find_seq(c.launches, seq) : nullptr) {
        sp.extra = l->idx;
        d.bucket.push_back(sp);
      }
    }
  }
  // Overlap: bucket all-reduce time inside a backward window (both lists sorted, windows disjoint).
  auto w = std::partition_point(c.backward.begin(), c.backward.end(), [t0](const TimeInterval& x) { return x.e < t0; });
  for (const RowSpan& bk : d.bucket) {
    while (w != c.backward.end() && w->e <= bk.b) ++w;
    for (auto v = w; v != c.backward.end() && v->b < bk.e; ++v) {
      const double b = std::max(bk.b, v->b), e = std::min(bk.e, v->e);
      if (e > b) d.overlap.push_back({b, e});
    }
  }
}

double overlap_of(const Snapshot& s, int32_t iter) {
  const int64_t step = static_cast<int64_t>(iter) + 1;
  const size_t guess = static_cast<size_t>(std::max<int64_t>(0, step - 1));
  if (guess < s.history.size() && s.history[guess].step == step) return s.history[guess].overlap;
  for (auto it = s.history.rbegin(); it != s.history.rend(); ++it)
    if (it->step == step) return it->overlap;
  return -1;
}

}  // namespace dtlab::app
