// The timeline, Tracy style: per rank a compute lane (forward, backward, loss and optimizer ops, with
// gradient-ready and launch ticks) and a comm lane (collectives, DDP bucket all-reduces, ring steps),
// over faint iteration bands. The comm lane is lit where a bucket's all-reduce runs while backward
// is still computing: the overlap DDP's buckets exist for. Wheel zooms around the cursor, dragging
// pans; until then the view follows the latest iterations. Each rank's rows are kept between frames
// and extended with the new events only; drawing culls by binary search and merges spans under a
// pixel, so a frame costs about what is on screen, whatever the window holds.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <string>
#include <vector>

#include <imgui_internal.h>  // SetItemUsingMouseWheel: over the timeline the wheel zooms, never scrolls

#include "app/views/views.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

// ---- colors: one per kind of work, so the legend holds for every rank (ranks own the lane chips)
constexpr ImU32 kForward = IM_COL32(96, 148, 232, 255);
constexpr ImU32 kBackward = IM_COL32(238, 128, 64, 255);
constexpr ImU32 kLoss = IM_COL32(226, 196, 72, 255);
constexpr ImU32 kOptimizer = IM_COL32(112, 196, 104, 255);
constexpr ImU32 kOtherCompute = IM_COL32(128, 132, 142, 255);
constexpr ImU32 kCollective = IM_COL32(64, 190, 192, 255);
constexpr ImU32 kBucket = IM_COL32(206, 118, 222, 255);
constexpr ImU32 kRingScatter = IM_COL32(36, 132, 140, 255);
constexpr ImU32 kRingGather = IM_COL32(120, 222, 222, 255);
constexpr ImU32 kOverlap = IM_COL32(255, 236, 110, 255);
constexpr ImU32 kPaused = IM_COL32(150, 150, 156, 255);
constexpr ImU32 kGradReady = IM_COL32(236, 236, 236, 220);
constexpr ImU32 kSpanText = IM_COL32(16, 18, 22, 255);

ImU32 alpha(ImU32 c, float a) {
  const ImU32 v = static_cast<ImU32>(a * static_cast<float>((c >> IM_COL32_A_SHIFT) & 0xFF) + 0.5f);
  return (c & ~IM_COL32_A_MASK) | (std::min<ImU32>(v, 255) << IM_COL32_A_SHIFT);
}
ImU32 darker(ImU32 c, float k) {
  ImVec4 v = ImGui::ColorConvertU32ToFloat4(c);
  return ImGui::ColorConvertFloat4ToU32(ImVec4(v.x * k, v.y * k, v.z * k, v.w));
}

ImU32 compute_color(ComputeKind k) {
  switch (k) {
    case ComputeKind::LayerForward: return kForward;
    case ComputeKind::LayerBackward: return kBackward;
    case ComputeKind::Loss: return kLoss;
    case ComputeKind::LossBackward: return darker(kLoss, 0.82f);
    case ComputeKind::OptimizerStep: return kOptimizer;
    default: return kOtherCompute;
  }
}
const char* compute_short(ComputeKind k) {
  switch (k) {
    case ComputeKind::LayerForward: return "fwd";
    case ComputeKind::LayerBackward: return "bwd";
    case ComputeKind::Loss: return "loss";
    case ComputeKind::LossBackward: return "loss bwd";
    case ComputeKind::OptimizerStep: return "opt";
    case ComputeKind::ZeroGrad: return "zero";
    default: return "op";
  }
}

// ---- time: both clocks as seconds; the view range lives in file state, as Tracy keeps its zoom
struct Clock {
  bool modeled = true;
  double begin(const Event& e) const { return modeled ? e.model_begin : static_cast<double>(e.wall_begin_ns) * 1e-9; }
  double end(const Event& e) const { return modeled ? e.model_end : static_cast<double>(e.wall_end_ns) * 1e-9; }
};

struct TimelineState {
  bool follow = true;    // track the latest iterations until the user zooms or pans
  bool modeled = true;   // the clock t0/t1 are in
  double t0 = 0, t1 = 1e-3;
};
TimelineState g_view;

// Per-frame geometry shared by the ruler and every lane.
struct Axis {
  double t0 = 0, t1 = 1;
  float x0 = 0, x1 = 1;
  double px_per_s = 1;
  float x(double t) const {  // clamped so a far-off time never overflows a float
    return x0 + static_cast<float>(std::clamp((t - t0) * px_per_s, -1e6, 1e6));
  }
  double t(float px) const { return t0 + static_cast<double>(px - x0) / px_per_s; }
};

std::string fmt_flops(double f) {
  char buf[40];
  if (f >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GFLOP", f * 1e-9);
  else if (f >= 1e6) std::snprintf(buf, sizeof buf, "%.2f MFLOP", f * 1e-6);
  else if (f >= 1e3) std::snprintf(buf, sizeof buf, "%.1f kFLOP", f * 1e-3);
  else std::snprintf(buf, sizeof buf, "%.0f FLOP", f);
  return buf;
}

const char* label_of(const Snapshot& s, int32_t id) {
  return id >= 0 && id < static_cast<int32_t>(s.labels.size()) ? s.labels[static_cast<size_t>(id)].c_str() : "";
}

// Overlap DDP reported for iteration `iter` (StepPoint.step = iteration + 1); -1 when none.
double overlap_of(const Snapshot& s, int32_t iter) {
  const int64_t step = static_cast<int64_t>(iter) + 1;
  const size_t guess = static_cast<size_t>(std::max<int64_t>(0, step - 1));
  if (guess < s.history.size() && s.history[guess].step == step) return s.history[guess].overlap;
  for (auto it = s.history.rbegin(); it != s.history.rend(); ++it)
    if (it->step == step) return it->overlap;
  return -1;
}

// ---- one rank's rows, kept across frames. The Session only appends events (and drops whole old
// iterations from the front), so a frame scans only what is new; rows stay sorted by begin, and
// culling is a binary search.
struct Span {
  double b = 0, e = 0;
  double reach = 0;        // the furthest end of this span and every earlier one in its row
  int32_t idx = -1;        // the event: s.events[rank][idx]
  int32_t extra = -1;      // bucket spans made from a collective: the BucketLaunch naming the bucket
  int16_t steps_done = 0;  // the collective in flight: ring steps finished
  bool in_flight = false;
};
struct Interval { double b, e; };
struct IterExtent { int32_t iter; double b, e; bool complete; };
struct SeqIndex { uint64_t seq; int32_t idx; };

struct RankCache {
  // What was scanned: events [0, n) of a window whose first and n-th events were these.
  size_t n = 0;
  uint64_t front_order = 0, back_order = 0;
  int64_t front_wall = 0, back_wall = 0;
  bool modeled = true;
  std::vector<Span> compute, coll, ring, gate, grad_ready, issues, launch_marks;
  std::vector<SeqIndex> launches, bucket_allreduces;  // by collective seq
  std::vector<Interval> backward;  // windows of consecutive layer-backward ops: what DDP overlaps with
  bool in_backward = false;
  std::vector<int32_t> ring_tail;  // ring steps since the last finished collective: the one in flight
  std::vector<IterExtent> iters;   // finished ones from their Iteration events, the running one from its events
  double frontier[2] = {-DBL_MAX, -DBL_MAX};  // where each lane's recorded work ends
  double t_min = DBL_MAX, t_max = -DBL_MAX;
  bool unsorted = false;

  void reset(bool clock_modeled) {  // keeps the capacity: a rescan happens every iteration
    n = 0;
    modeled = clock_modeled;
    for (auto* row : {&compute, &coll, &ring, &gate, &grad_ready, &issues, &launch_marks}) row->clear();
    launches.clear(), bucket_allreduces.clear(), backward.clear(), ring_tail.clear(), iters.clear();
    in_backward = unsorted = false;
    frontier[0] = frontier[1] = -DBL_MAX;
    t_min = DBL_MAX, t_max = -DBL_MAX;
  }
};

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

void push_span(RankCache& c, std::vector<Span>& row, double b, double e, size_t idx) {
  if (!row.empty() && b < row.back().b) c.unsorted = true;
  Span sp;
  sp.b = b, sp.e = e, sp.idx = static_cast<int32_t>(idx);
  sp.reach = row.empty() ? e : std::max(row.back().reach, e);
  row.push_back(sp);
}

void push_seq(RankCache& c, std::vector<SeqIndex>& v, uint64_t seq, size_t idx) {
  if (!v.empty() && seq < v.back().seq) c.unsorted = true;
  v.push_back({seq, static_cast<int32_t>(idx)});
}

void scan_rank(RankCache& c, const std::vector<Event>& evs, const Clock& clk) {
  const size_t n = evs.size();
  const bool same = c.n > 0 && n >= c.n && c.modeled == clk.modeled && evs[0].order == c.front_order &&
                    evs[0].wall_begin_ns == c.front_wall && evs[c.n - 1].order == c.back_order &&
                    evs[c.n - 1].wall_end_ns == c.back_wall;
  if (!same) c.reset(clk.modeled);  // the front was trimmed, a new run began or the clock changed
  if (n == c.n) return;
  for (size_t i = c.n; i < n; i++) {
    const Event& e = evs[i];
    const double b = clk.begin(e), en = clk.end(e);
    c.t_min = std::min(c.t_min, b), c.t_max = std::max(c.t_max, en);
    add_to_iteration(c.iters, e, b, en);
    switch (e.kind) {
      case EventKind::Compute:
        c.frontier[0] = std::max(c.frontier[0], en);
        if (e.compute.kind == ComputeKind::LayerBackward) {
          if (!c.in_backward) c.backward.push_back({b, en}), c.in_backward = true;
          else c.backward.back().e = std::max(c.backward.back().e, en);
        } else {
          c.in_backward = false;
        }
        push_span(c, c.compute, b, en, i);
        break;
      case EventKind::GradReady: push_span(c, c.grad_ready, b, b, i); break;
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
  if (c.unsorted) {  // not expected from the engine; stay correct if it ever happens
    for (auto* row : {&c.compute, &c.coll, &c.ring, &c.gate, &c.grad_ready, &c.issues, &c.launch_marks}) {
      std::stable_sort(row->begin(), row->end(), [](const Span& x, const Span& y) { return x.b < y.b; });
      for (size_t i = 0; i < row->size(); i++) (*row)[i].reach = std::max((*row)[i].e, i ? (*row)[i - 1].reach : -DBL_MAX);
    }
    for (auto* v : {&c.launches, &c.bucket_allreduces})
      std::stable_sort(v->begin(), v->end(), [](const SeqIndex& x, const SeqIndex& y) { return x.seq < y.seq; });
    c.unsorted = false;
  }
  if (!std::is_sorted(c.iters.begin(), c.iters.end(), [](const IterExtent& x, const IterExtent& y) { return x.iter < y.iter; }))
    std::sort(c.iters.begin(), c.iters.end(), [](const IterExtent& x, const IterExtent& y) { return x.iter < y.iter; });
  c.n = n;
  c.front_order = evs[0].order, c.front_wall = evs[0].wall_begin_ns;
  c.back_order = evs[n - 1].order, c.back_wall = evs[n - 1].wall_end_ns;
}

// The spans of a row that reach into [t0, t1].
struct SpanRange {
  const Span* first;
  const Span* last;
};
SpanRange visible(const std::vector<Span>& row, double t0, double t1) {
  const Span* b = row.data();
  const Span* e = b + row.size();
  const Span* first = std::partition_point(b, e, [t0](const Span& sp) { return sp.reach < t0; });
  return {first, std::partition_point(first, e, [t1](const Span& sp) { return sp.b <= t1; })};
}

const SeqIndex* find_seq(const std::vector<SeqIndex>& v, uint64_t seq) {
  auto it = std::lower_bound(v.begin(), v.end(), seq, [](const SeqIndex& x, uint64_t s) { return x.seq < s; });
  return it != v.end() && it->seq == seq ? &*it : nullptr;
}

// What one frame draws for a rank beyond its cached rows: bucket all-reduces (their own events,
// or, while backward still runs and DDP has not recorded them yet, their collective with the
// launch that names the bucket), the collective in flight, and the overlap with backward.
struct Derived {
  std::vector<Span> bucket, coll_tail;  // coll_tail: the in-flight collective, drawn after the row
  std::vector<Interval> overlap;
};

void derive(const RankCache& c, const std::vector<Event>& evs, const Clock& clk, double t0, double t1, Derived& d) {
  d.bucket.clear(), d.coll_tail.clear(), d.overlap.clear();
  const SpanRange cr = visible(c.coll, t0, t1);
  for (const Span* sp = cr.first; sp < cr.last; ++sp) {
    const uint64_t seq = evs[static_cast<size_t>(sp->idx)].coll.seq;
    Span bk = *sp;
    if (const SeqIndex* ba = find_seq(c.bucket_allreduces, seq)) bk.idx = ba->idx;
    else if (const SeqIndex* l = find_seq(c.launches, seq)) bk.extra = l->idx;
    else continue;
    d.bucket.push_back(bk);
  }
  if (!c.ring_tail.empty()) {
    Span sp;
    sp.b = DBL_MAX, sp.e = -DBL_MAX, sp.in_flight = true;
    for (int32_t i : c.ring_tail) {
      const Event& r = evs[static_cast<size_t>(i)];
      sp.b = std::min(sp.b, clk.begin(r)), sp.e = std::max(sp.e, clk.end(r));
      sp.steps_done = std::max<int16_t>(sp.steps_done, static_cast<int16_t>(r.step.step + 1));
    }
    const uint64_t seq = evs[static_cast<size_t>(c.ring_tail.back())].step.seq;
    sp.idx = c.ring_tail.back();
    for (auto it = c.issues.rbegin(); it != c.issues.rend(); ++it)
      if (evs[static_cast<size_t>(it->idx)].coll.seq == seq) {
        sp.idx = it->idx;
        break;
      }
    sp.reach = sp.e;
    if (sp.e >= t0 && sp.b <= t1) {
      d.coll_tail.push_back(sp);
      if (const SeqIndex* l = find_seq(c.launches, seq)) {
        sp.extra = l->idx;
        d.bucket.push_back(sp);
      }
    }
  }
  // Overlap: bucket all-reduce time inside a backward window (both lists sorted, windows disjoint).
  auto w = std::partition_point(c.backward.begin(), c.backward.end(), [t0](const Interval& x) { return x.e < t0; });
  for (const Span& bk : d.bucket) {
    while (w != c.backward.end() && w->e <= bk.b) ++w;
    for (auto v = w; v != c.backward.end() && v->b < bk.e; ++v) {
      const double b = std::max(bk.b, v->b), e = std::min(bk.e, v->e);
      if (e > b) d.overlap.push_back({b, e});
    }
  }
}

// ---- drawing
struct Hover {
  enum Kind { None, Ev, Merged, Overlap, Paused } kind = None;
  Span span;
  int count = 0;
  int rank = 0;
  const char* what = "";
};

// Axis-aligned lines as 1-px rectangles: crisp, and 4 vertices instead of an anti-aliased strip
// (the vertices are what llvmpipe spends its time on).
void vline(ImDrawList* dl, float x, float y0, float y1, ImU32 col, float w = 1.0f) {
  dl->AddRectFilled(ImVec2(std::floor(x), y0), ImVec2(std::floor(x) + w, y1), col);
}
void hline(ImDrawList* dl, float x0, float x1, float y, ImU32 col) {
  dl->AddRectFilled(ImVec2(x0, std::floor(y)), ImVec2(x1, std::floor(y) + 1), col);
}

// Text inside [x0, x1] at row y: the long label when it fits, else the short one, else nothing.
void span_label(ImDrawList* dl, float size, float x0, float x1, float y, const char* longer, const char* shorter) {
  const float room = x1 - x0 - 4.0f;
  if (room < size * 0.9f) return;
  ImFont* font = ImGui::GetFont();
  for (const char* t : {longer, shorter}) {
    if (!t || !*t) continue;
    const float w = font->CalcTextSizeA(size, FLT_MAX, 0, t).x;
    if (w <= room) {
      dl->AddText(font, size, ImVec2(std::max(x0 + 2.0f, (x0 + x1 - w) * 0.5f), y), kSpanText, t);
      return;
    }
  }
}

struct RowCtx {
  ImDrawList* dl;
  const Axis& ax;
  const std::vector<Event>& evs;
  ImVec2 mouse;
  bool mouse_in;
  Hover& hover;
  int rank;
  float text_size;
};

// Draws one row of spans in [y0, y1]. Spans under a pixel merge with their neighbours into one
// block, and a run of them is skipped with a binary search, so a zoomed-out view of thousands of
// ops costs about one rectangle per pixel column.
template <class ColorFn, class LabelFn>
void draw_row(RowCtx& rc, SpanRange range, float y0, float y1, ColorFn color_of, LabelFn label_of) {
  const Axis& ax = rc.ax;
  float run_x0 = 0, run_x1 = 0;
  int run_n = 0;
  const Span* run_first = nullptr;
  double run_b = 0, run_e = 0;
  auto hit = [&](float a, float b) {
    return rc.mouse_in && rc.mouse.x >= a - 1 && rc.mouse.x <= b + 1 && rc.mouse.y >= y0 && rc.mouse.y <= y1;
  };
  auto ev = [&](const Span& sp) -> const Event& { return rc.evs[static_cast<size_t>(sp.idx)]; };
  auto flush = [&] {
    if (!run_n) return;
    const ImU32 col = color_of(*run_first, ev(*run_first));
    const ImVec2 a(run_x0, y0), b(std::max(run_x1, run_x0 + 1), y1);
    if (run_n == 1) {
      rc.dl->AddRectFilled(a, b, col);
      if (hit(a.x, b.x)) rc.hover.kind = Hover::Ev, rc.hover.span = *run_first, rc.hover.rank = rc.rank;
    } else {  // merged: a dimmed block with a solid base line (Tracy's zig-zag is too busy at this height)
      rc.dl->AddRectFilled(a, b, alpha(col, 0.55f));
      rc.dl->AddRectFilled(ImVec2(a.x, y1 - 2), b, col);
      if (hit(a.x, b.x)) {
        rc.hover.kind = Hover::Merged, rc.hover.span = *run_first, rc.hover.count = run_n, rc.hover.rank = rc.rank;
        rc.hover.span.b = run_b, rc.hover.span.e = run_e;
      }
    }
    run_n = 0;
  };
  const float clip0 = ax.x0 - 4, clip1 = ax.x1 + 4;
  char longer[96], shorter[48];
  for (const Span* sp = range.first; sp < range.last; ++sp) {
    const float xa = std::max(ax.x(sp->b), clip0), xb = std::min(ax.x(sp->e), clip1);
    if (xb - xa < 1.0f) {
      if (run_n && xa <= run_x1 + 1.0f) {
        run_x1 = std::max(run_x1, xb), run_e = std::max(run_e, sp->e), run_n++;
      } else {
        flush();
        run_x0 = xa, run_x1 = xb, run_b = sp->b, run_e = sp->e, run_n = 1, run_first = sp;
      }
      // Spans starting before the next pixel column join the run. Spans in a row do not overlap, so
      // all but the last of them also end there; the last is looked at normally.
      const double t_next = ax.t(run_x1 + 1.0f);
      const Span* j = std::partition_point(sp + 1, range.last, [t_next](const Span& x) { return x.b <= t_next; });
      if (j - sp > 2) {
        const Span* last_narrow = j - 2;
        run_n += static_cast<int>(last_narrow - sp);
        run_x1 = std::max(run_x1, std::min(ax.x(last_narrow->e), clip1)), run_e = std::max(run_e, last_narrow->e);
        sp = last_narrow;
      }
      continue;
    }
    flush();
    const Event& e = ev(*sp);
    const ImU32 col = color_of(*sp, e);
    const bool border = xb - xa > 4.0f;  // a darker frame, as a rectangle under the body
    if (border) rc.dl->AddRectFilled(ImVec2(xa, y0), ImVec2(xb, y1), darker(col, 0.55f));
    const ImVec2 ia(border ? xa + 1 : xa, border ? y0 + 1 : y0), ib(border ? xb - 1 : xb, border ? y1 - 1 : y1);
    if (sp->in_flight) {  // still running: a lighter, hatched body
      rc.dl->AddRectFilled(ia, ib, border ? darker(col, 0.5f) : alpha(col, 0.45f));
      draw_hatch(rc.dl, ia, ib, col, 6.0f);
    } else {
      rc.dl->AddRectFilled(ia, ib, col);
    }
    if (xb - xa > rc.text_size) {
      longer[0] = shorter[0] = 0;
      label_of(*sp, e, longer, sizeof longer, shorter, sizeof shorter);
      span_label(rc.dl, rc.text_size, std::max(xa, ax.x0), std::min(xb, ax.x1), y0 + (y1 - y0 - rc.text_size) * 0.5f,
                 longer, shorter);
    }
    if (hit(xa, xb)) rc.hover.kind = Hover::Ev, rc.hover.span = *sp, rc.hover.rank = rc.rank;
  }
  flush();
}

// Instants of one kind: one glyph per pixel column (a binary search skips the rest of the column).
template <class GlyphFn>
void draw_instants(RowCtx& rc, SpanRange range, float y0, float y1, float half_w, GlyphFn glyph) {
  const Axis& ax = rc.ax;
  for (const Span* sp = range.first; sp < range.last;) {
    const float x = std::floor(ax.x(sp->b)) + 0.5f;
    glyph(x);
    if (rc.mouse_in && std::fabs(rc.mouse.x - x) <= std::max(3.0f, half_w) && rc.mouse.y >= y0 && rc.mouse.y <= y1)
      rc.hover.kind = Hover::Ev, rc.hover.span = *sp, rc.hover.rank = rc.rank;
    const double t_next = ax.t(x + 0.5f);
    sp = std::partition_point(sp + 1, range.last, [t_next](const Span& s) { return s.b < t_next; });
  }
}

// Lane geometry in "lane units" u: the font size, stretched (up to 1.6x) when the ranks would
// leave the panel half empty. Row offsets are from the top of their lane.
struct Layout {
  float fs = 13, u = 13, label_w = 100;
  float compute_h = 0, comm_h = 0, gap = 0, rank_h = 0;
  float op0 = 0, op1 = 0;  // compute lane: ops (instants below, to the lane's end)
  float ov0 = 0, ov1 = 0;  // comm lane: the overlap marker
  float co0 = 0, co1 = 0;  // collectives
  float bu0 = 0, bu1 = 0;  // bucket all-reduces
  float ri0 = 0, ri1 = 0;  // ring steps
};

Layout make_layout(float fs, float stretch) {
  Layout L;
  L.fs = fs;
  L.u = fs * stretch;
  const float u = L.u;
  L.label_w = ImGui::CalcTextSize("rank 00 compute").x + 2.3f * fs;  // room for the pause glyph
  L.compute_h = 1.72f * u;
  L.op0 = 0.14f * u, L.op1 = 1.24f * u;
  L.comm_h = 2.78f * u;
  L.ov0 = 0.0f, L.ov1 = 0.2f * u;
  L.co0 = 0.26f * u, L.co1 = 1.36f * u;
  L.bu0 = 1.42f * u, L.bu1 = 2.22f * u;
  L.ri0 = 2.28f * u, L.ri1 = 2.62f * u;
  L.gap = 0.4f * u;
  L.rank_h = L.compute_h + L.comm_h + L.gap;
  return L;
}

void draw_rank(const Snapshot& s, const RankCache& c, const Derived& d, int rank, float y, const Layout& L, RowCtx& rc) {
  ImDrawList* dl = rc.dl;
  const Axis& ax = rc.ax;
  const float fs = L.fs;
  const float yc = y, ym = y + L.compute_h, ye = ym + L.comm_h;  // compute lane, comm lane, end
  // Iteration bands: every other iteration faintly lit (llvmpipe pays for every translucent
  // layer over the whole panel, so the even ones stay bare), a line where each begins.
  for (const IterExtent& it : c.iters) {
    const float a = std::max(ax.x(it.b), ax.x0), b = std::min(ax.x(it.e), ax.x1);
    if (b <= a) continue;
    if (it.iter % 2) dl->AddRectFilled(ImVec2(a, yc), ImVec2(b, ye), IM_COL32(255, 255, 255, 13));
    if (ax.x(it.b) >= ax.x0) vline(dl, a, yc, ye, IM_COL32(255, 255, 255, 60));
  }
  // Overlap: the comm lane lit where a bucket all-reduce runs under backward.
  for (const Interval& o : d.overlap) {
    const float a = std::max(ax.x(o.b), ax.x0), b = std::max(std::min(ax.x(o.e), ax.x1), a + 1);
    dl->AddRectFilled(ImVec2(a, ym + L.ov1), ImVec2(b, ye), alpha(kOverlap, 0.22f));
    dl->AddRectFilled(ImVec2(a, ym + L.ov0), ImVec2(b, ym + L.ov1), kOverlap);
    if (rc.mouse_in && rc.mouse.x >= a && rc.mouse.x <= b && rc.mouse.y >= ym && rc.mouse.y <= ye)
      rc.hover.kind = Hover::Overlap, rc.hover.span = Span{o.b, o.e}, rc.hover.rank = rank;
  }
  const double t0 = ax.t(ax.x0 - 4), t1 = ax.t(ax.x1 + 4);
  // Compute lane: ops, then instants in the strip under them.
  const float bar0 = yc + L.op0, bar1 = yc + L.op1;
  draw_row(rc, visible(c.compute, t0, t1), bar0, bar1, [](const Span&, const Event& e) { return compute_color(e.compute.kind); },
           [](const Span&, const Event& e, char* l, size_t ln, char* sh, size_t sn) {
             const ComputeInfo& ci = e.compute;
             if (ci.layer >= 0) {
               std::snprintf(l, ln, "%s %d", compute_kind_name(ci.kind), ci.layer);
               std::snprintf(sh, sn, "%s %d", compute_short(ci.kind), ci.layer);
             } else {
               std::snprintf(l, ln, "%s", compute_kind_name(ci.kind));
               std::snprintf(sh, sn, "%s", compute_short(ci.kind));
             }
           });
  const float strip0 = bar1 + 1, strip1 = ym - 1;
  draw_instants(rc, visible(c.grad_ready, t0, t1), strip0, ym, 0, [&](float x) {
    vline(dl, x - 0.5f, strip0 + 1, strip1, kGradReady, 2.0f);
  });
  const float wi = 0.22f * L.u, wl = 0.3f * L.u;
  draw_instants(rc, visible(c.issues, t0, t1), strip0, ym, wi, [&](float x) {
    dl->AddTriangleFilled(ImVec2(x - wi, strip0), ImVec2(x + wi, strip0), ImVec2(x, strip1 + 1), kCollective);
  });
  draw_instants(rc, visible(c.launch_marks, t0, t1), strip0, ym, wl, [&](float x) {
    dl->AddTriangleFilled(ImVec2(x - wl, strip0), ImVec2(x + wl, strip0), ImVec2(x, strip1 + 1), kBucket);
  });
  // Comm lane: collectives (and the one in flight), the bucket each all-reduce carries, ring steps.
  auto coll_label = [](const Span& sp, const Event& e, char* l, size_t ln, char* sh, size_t sn) {
    const bool info = e.kind != EventKind::RingStep;
    const unsigned long long seq = info ? e.coll.seq : e.step.seq;
    const char* op = info ? collective_name(e.coll.op) : "collective";
    if (sp.in_flight) std::snprintf(l, ln, "%s #%llu: %d steps done", op, seq, sp.steps_done);
    else std::snprintf(l, ln, "%s #%llu %s", op, seq, algorithm_name(e.coll.algo));
    std::snprintf(sh, sn, "#%llu", seq);
  };
  auto coll_color = [](const Span&, const Event&) { return kCollective; };
  draw_row(rc, visible(c.coll, t0, t1), ym + L.co0, ym + L.co1, coll_color, coll_label);
  draw_row(rc, SpanRange{d.coll_tail.data(), d.coll_tail.data() + d.coll_tail.size()}, ym + L.co0, ym + L.co1, coll_color,
           coll_label);
  const float text_size = rc.text_size;
  rc.text_size = std::min(0.8f * L.u, fs);
  const std::vector<Event>& evs = rc.evs;
  draw_row(rc, SpanRange{d.bucket.data(), d.bucket.data() + d.bucket.size()}, ym + L.bu0, ym + L.bu1,
           [](const Span&, const Event&) { return kBucket; },
           [&evs](const Span& sp, const Event& e, char* l, size_t ln, char* sh, size_t sn) {
             const Event& src = sp.extra >= 0 ? evs[static_cast<size_t>(sp.extra)] : e;
             std::snprintf(l, ln, "bucket %d", src.bucket.bucket);
             std::snprintf(sh, sn, "b%d", src.bucket.bucket);
           });
  rc.text_size = text_size;
  draw_row(rc, visible(c.ring, t0, t1), ym + L.ri0, ym + L.ri1,
           [](const Span&, const Event& e) {
             switch (e.step.phase) {
               case RingPhase::ReduceScatter:
               case RingPhase::Reduce: return kRingScatter;
               case RingPhase::AllGather:
               case RingPhase::Broadcast: return kRingGather;
               default: return darker(kCollective, 0.8f);
             }
           },
           [](const Span&, const Event&, char*, size_t, char*, size_t) {});
  // Gates: time a rank spent held by the stepper, hatched grey.
  const SpanRange gates = visible(c.gate, t0, t1);
  for (const Span* sp = gates.first; sp < gates.last; ++sp) {
    const float a = std::max(ax.x(sp->b), ax.x0), b = std::max(std::min(ax.x(sp->e), ax.x1), a + 1);
    const bool comm = rc.evs[static_cast<size_t>(sp->idx)].lane == Lane::Comm;
    const float g0 = comm ? ym + L.co0 : bar0, g1 = comm ? ym + L.ri1 : bar1;
    dl->AddRectFilled(ImVec2(a, g0), ImVec2(b, g1), alpha(kPaused, 0.25f));
    draw_hatch(dl, ImVec2(a, g0), ImVec2(b, g1), alpha(kPaused, 0.8f), 5.0f);
    if (rc.mouse_in && rc.mouse.x >= a && rc.mouse.x <= b && rc.mouse.y >= g0 && rc.mouse.y <= g1)
      rc.hover.kind = Hover::Ev, rc.hover.span = *sp, rc.hover.rank = rank;
  }
  // A lane held at a stepper gate right now: hatched from where its work stops to the view's end.
  if (s.stepper.paused)
    for (int lane = 0; lane < 2; lane++) {
      const size_t gi = static_cast<size_t>(rank * 2 + lane);
      if (gi >= s.stepper.gates.size() || !s.stepper.gates[gi].blocked) continue;
      const double from = c.frontier[lane] > -DBL_MAX ? c.frontier[lane] : ax.t0;
      const float a = std::max(ax.x(from), ax.x0), b = ax.x1;
      if (b <= a) continue;
      const float g0 = lane ? ym + L.co0 : bar0, g1 = lane ? ym + L.ri1 : bar1;
      dl->AddRectFilled(ImVec2(a, g0), ImVec2(b, g1), alpha(kPaused, 0.12f));
      draw_hatch(dl, ImVec2(a, g0), ImVec2(b, g1), alpha(kPaused, 0.45f), 7.0f);
      vline(dl, a, g0, g1, kPaused, 2.0f);
      const char* what = gate_kind_name(s.stepper.gates[gi].kind);
      char text[64];
      std::snprintf(text, sizeof text, "paused at %s gate", what);
      const float tw = ImGui::CalcTextSize(text).x;
      if (b - a > tw + 8) {
        const ImVec2 tp(a + 6, g0 + (L.co1 - L.co0 - fs) * 0.5f);
        dl->AddRectFilled(ImVec2(tp.x - 2, tp.y), ImVec2(tp.x + tw + 2, tp.y + fs), IM_COL32(30, 30, 34, 220));
        dl->AddText(tp, IM_COL32(220, 220, 226, 255), text);
      }
      if (rc.mouse_in && rc.mouse.x >= a && rc.mouse.x <= b && rc.mouse.y >= g0 && rc.mouse.y <= g1)
        rc.hover.kind = Hover::Paused, rc.hover.span = Span{from, from}, rc.hover.rank = rank, rc.hover.what = what;
    }
}

// The label column, drawn over whatever spans scrolled under it.
void draw_rank_labels(const Snapshot& s, int rank, float x, float y, const Layout& L, ImDrawList* dl) {
  const float fs = L.fs;
  const int world = std::max(1, s.config.world);
  const float ym = y + L.compute_h, ye = ym + L.comm_h;
  // One opaque fill: the window background tinted a tenth of the way towards the rank's color.
  const ImVec4 bg = ImGui::GetStyleColorVec4(ImGuiCol_WindowBg), rc = ImGui::ColorConvertU32ToFloat4(rank_color(rank, world));
  const ImVec4 tint(bg.x + 0.1f * (rc.x - bg.x), bg.y + 0.1f * (rc.y - bg.y), bg.z + 0.1f * (rc.z - bg.z), 1.0f);
  dl->AddRectFilled(ImVec2(x, y), ImVec2(x + L.label_w, ye), ImGui::ColorConvertFloat4ToU32(tint));
  dl->AddRectFilled(ImVec2(x, y), ImVec2(x + 0.3f * fs, ye), rank_color(rank, world));
  char name[32];
  std::snprintf(name, sizeof name, "rank %d", rank);
  const float tx = x + 0.6f * fs;
  dl->AddText(ImVec2(tx, y + (L.op0 + L.op1 - fs) * 0.5f), rank_color(rank, world), name);
  const ImU32 dim = ImGui::GetColorU32(ImGuiCol_Text, 0.75f);
  const float sub = tx + ImGui::CalcTextSize("rank 00 ").x;
  dl->AddText(ImVec2(sub, y + (L.op0 + L.op1 - fs) * 0.5f), dim, "compute");
  dl->AddText(ImVec2(sub, ym + (L.co0 + L.co1 - fs) * 0.5f), dim, "comm");
  hline(dl, x + 0.3f * fs, x + L.label_w, ym, IM_COL32(255, 255, 255, 30));
  // Pause glyphs for lanes held at a gate, so stepping reads even when the hatch is off screen.
  if (s.stepper.paused)
    for (int lane = 0; lane < 2; lane++) {
      const size_t gi = static_cast<size_t>(rank * 2 + lane);
      if (gi >= s.stepper.gates.size() || !s.stepper.gates[gi].blocked) continue;
      const float cy = lane ? ym + 0.5f * (L.co0 + L.co1) : y + 0.5f * (L.op0 + L.op1), px = x + L.label_w - 0.6f * fs;
      const float h = 0.32f * fs, w = 0.14f * fs;
      dl->AddRectFilled(ImVec2(px - 2 * w, cy - h), ImVec2(px - w, cy + h), IM_COL32(210, 210, 215, 255));
      dl->AddRectFilled(ImVec2(px, cy - h), ImVec2(px + w, cy + h), IM_COL32(210, 210, 215, 255));
    }
}

// ---- ruler: 1-2-5 steps about seven font sizes apart, labelled in the step's unit
struct Ticks {
  double step = 1, scale = 1;
  const char* unit = "s";
  int decimals = 0;
  int64_t k0 = 0, k1 = -1;  // tick indices in view: t = k * step
};

Ticks make_ticks(const Axis& ax, float fs) {
  Ticks t;
  const double raw = 7.0 * fs / ax.px_per_s;
  const double p10 = std::pow(10.0, std::floor(std::log10(raw)));
  const double m = raw / p10;
  t.step = (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p10;
  // The unit of the largest time in view ("1.2 ms" rather than "1200 µs"), unless that needs more
  // than three decimals; then the step's own unit.
  auto pick = [&t](double v) {
    if (v < 1e-6) t.scale = 1e9, t.unit = "ns";
    else if (v < 1e-3) t.scale = 1e6, t.unit = "\xC2\xB5s";
    else if (v < 1) t.scale = 1e3, t.unit = "ms";
    else t.scale = 1, t.unit = "s";
    t.decimals = std::max(0, static_cast<int>(std::ceil(-std::log10(t.step * t.scale) - 1e-9)));
  };
  pick(std::max(std::fabs(ax.t0), std::fabs(ax.t1)));
  if (t.decimals > 3) pick(t.step);
  t.k0 = static_cast<int64_t>(std::ceil(ax.t0 / t.step));
  t.k1 = static_cast<int64_t>(std::floor(ax.t1 / t.step));
  if (t.k1 - t.k0 > 1000) t.k1 = t.k0 + 1000;
  return t;
}

// Absolute time with as many decimals as `step` resolves, in the unit of the time's own size.
std::string fmt_time_at(double t, double step) {
  const double a = std::fabs(t);
  double scale = 1;
  const char* unit = "s";
  if (a < 1e-6) scale = 1e9, unit = "ns";
  else if (a < 1e-3) scale = 1e6, unit = "\xC2\xB5s";
  else if (a < 1) scale = 1e3, unit = "ms";
  const int dec = std::clamp(static_cast<int>(std::ceil(-std::log10(step * scale) - 1e-9)), 0, 9);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f %s", dec, t * scale, unit);
  return buf;
}

// `keep_out`: the x range of the cursor's time label, which tick labels give way to.
void draw_ruler(ImDrawList* dl, const Axis& ax, const Ticks& tk, float y0, float y1, float fs, ImVec2 keep_out) {
  dl->AddRectFilled(ImVec2(ax.x0, y0), ImVec2(ax.x1, y1), ImGui::GetColorU32(ImGuiCol_FrameBg));
  const ImU32 line = ImGui::GetColorU32(ImGuiCol_Text, 0.55f), text = ImGui::GetColorU32(ImGuiCol_Text, 0.9f);
  const double minor = tk.step / (std::fabs(tk.step / std::pow(10.0, std::floor(std::log10(tk.step))) - 2) < 1e-6 ? 4 : 5);
  for (double t = std::ceil(ax.t0 / minor) * minor; t <= ax.t1; t += minor) {
    const float x = std::floor(ax.x(t)) + 0.5f;
    vline(dl, x, y1 - 0.25f * fs, y1, alpha(line, 0.6f));
  }
  // Far from zero a label like "12345678 µs" is unreadable: label the first tick in full and the
  // others relative to it, as Tracy does.
  const bool relative = std::fabs(static_cast<double>(tk.k0) * tk.step) > 1000 * tk.step;
  for (int64_t k = tk.k0; k <= tk.k1; k++) {
    const double t = static_cast<double>(k) * tk.step;
    const float x = std::floor(ax.x(t)) + 0.5f;
    vline(dl, x, y1 - 0.55f * fs, y1, line);
    char buf[48];
    if (relative && k != tk.k0)
      std::snprintf(buf, sizeof buf, "+%.*f %s", tk.decimals, static_cast<double>(k - tk.k0) * tk.step * tk.scale, tk.unit);
    else if (relative)
      std::snprintf(buf, sizeof buf, "%s", fmt_time_at(t, tk.step).c_str());
    else
      std::snprintf(buf, sizeof buf, "%.*f %s", tk.decimals, t * tk.scale, tk.unit);
    const float w = ImGui::CalcTextSize(buf).x;
    if (x + 3 + w < keep_out.x || x + 3 > keep_out.y) dl->AddText(ImVec2(x + 3, y0 + 0.15f * fs), text, buf);
  }
}

// ---- tooltips
void tip_row(const char* key, const char* fmt, ...) IM_FMTARGS(2);
void tip_row(const char* key, const char* fmt, ...) {
  ImGui::TableNextRow();
  ImGui::TableSetColumnIndex(0);
  ImGui::TextDisabled("%s", key);
  ImGui::TableSetColumnIndex(1);
  va_list args;
  va_start(args, fmt);
  ImGui::TextV(fmt, args);
  va_end(args);
}

void tip_times(const Event& e) {
  const bool instant = e.model_begin == e.model_end && e.wall_begin_ns == e.wall_end_ns;
  const double wb = static_cast<double>(e.wall_begin_ns) * 1e-9, we = static_cast<double>(e.wall_end_ns) * 1e-9;
  if (instant) {
    tip_row("modeled", "at %s", time_text(e.model_begin).c_str());
    tip_row("wall", "at %s", time_text(wb).c_str());
  } else {
    tip_row("modeled", "%s  from %s", time_text(e.model_end - e.model_begin).c_str(), time_text(e.model_begin).c_str());
    tip_row("wall", "%s  from %s", time_text(we - wb).c_str(), time_text(wb).c_str());
  }
}

void tip_collective(const CollectiveInfo& c) {
  tip_row("op", "%s (%s)", collective_name(c.op), reduce_op_name(c.reduce));
  tip_row("algorithm", "%s", algorithm_name(c.algo));
  tip_row("payload", "%s  (%lld elements)", human_bytes(c.bytes).c_str(), static_cast<long long>(c.in_count));
  tip_row("seq", "#%llu  (%d ranks)", static_cast<unsigned long long>(c.seq), c.group_size);
}

void tip_bucket(const Snapshot& s, const BucketInfo& b, float fs) {
  tip_row("bucket", "%d of %d  (generation %d)", b.bucket, b.num_buckets, b.generation);
  tip_row("bytes", "%s  (%d parameters)", human_bytes(b.bytes).c_str(), b.num_params);
  ImGui::TableNextRow();
  ImGui::TableSetColumnIndex(0);
  ImGui::TextDisabled("parameters");
  ImGui::TableSetColumnIndex(1);
  ImGui::PushTextWrapPos(ImGui::GetCursorPosX() + 26 * fs);
  ImGui::TextUnformatted(label_of(s, b.label));
  ImGui::PopTextWrapPos();
}

void event_tooltip(const Snapshot& s, const Hover& h, float fs) {
  const Span& sp = h.span;
  const std::vector<Event>& evs = s.events[static_cast<size_t>(h.rank)];
  const Event& e = evs[static_cast<size_t>(sp.idx)];
  const bool bucket_span = sp.extra >= 0 || e.kind == EventKind::BucketAllReduce;
  const Event* bucket_ev = sp.extra >= 0 ? &evs[static_cast<size_t>(sp.extra)] : &e;
  ImGui::BeginTooltip();
  if (h.kind == Hover::Merged)
    ImGui::Text("%d spans under one pixel (zoom in to tell them apart)", h.count);
  if (bucket_span) {
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kBucket), "bucket %d all-reduce%s", bucket_ev->bucket.bucket,
                       sp.in_flight ? " (in flight)" : "");
  } else {
    switch (e.kind) {
      case EventKind::Compute:
        if (e.compute.layer >= 0)
          ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(compute_color(e.compute.kind)), "%s  layer %d",
                             compute_kind_name(e.compute.kind), e.compute.layer);
        else
          ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(compute_color(e.compute.kind)), "%s", compute_kind_name(e.compute.kind));
        break;
      case EventKind::Collective:
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kCollective), "%s #%llu", collective_name(e.coll.op),
                           static_cast<unsigned long long>(e.coll.seq));
        break;
      case EventKind::CollectiveIssue:
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kCollective), sp.in_flight ? "%s #%llu in flight" : "%s #%llu issued",
                           collective_name(e.coll.op), static_cast<unsigned long long>(e.coll.seq));
        break;
      case EventKind::RingStep:
        if (sp.in_flight)
          ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kCollective), "collective #%llu in flight",
                             static_cast<unsigned long long>(e.step.seq));
        else
          ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kRingGather), "ring step %d of %d  (%s)", e.step.step + 1,
                             e.step.steps, ring_phase_name(e.step.phase));
        break;
      case EventKind::GradReady:
        ImGui::Text("gradient ready: %s", label_of(s, e.bucket.label));
        break;
      case EventKind::BucketLaunch:
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kBucket), "bucket %d launched", e.bucket.bucket);
        break;
      case EventKind::Gate:
        ImGui::Text("held at a stepper gate");
        break;
      default: ImGui::Text("%s", event_kind_name(e.kind)); break;
    }
  }
  if (ImGui::BeginTable("##tip", 2, ImGuiTableFlags_SizingFixedFit)) {
    tip_row("event", "%s", event_kind_name(e.kind));
    tip_row("rank", "%d", e.rank);
    tip_row("iteration", "%d", e.iteration);
    if (h.kind == Hover::Merged)
      tip_row("span", "%s  from %s", time_text(sp.e - sp.b).c_str(), time_text(sp.b).c_str());
    else if (sp.in_flight)
      tip_row("so far", "%s  (%d ring steps done)", time_text(sp.e - sp.b).c_str(), sp.steps_done);
    if (h.kind != Hover::Merged) tip_times(e);
    switch (e.kind) {
      case EventKind::Compute:
        tip_row("op", "%s", compute_kind_name(e.compute.kind));
        if (e.compute.layer >= 0) tip_row("layer", "%d", e.compute.layer);
        tip_row("cost", "%s", fmt_flops(e.compute.flops).c_str());
        break;
      case EventKind::Collective:
      case EventKind::CollectiveIssue:
        tip_collective(e.coll);
        if (!bucket_span)  // a DDP bucket's all-reduce says which bucket it carries
          for (auto it = evs.rbegin(); it != evs.rend(); ++it)
            if (it->kind == EventKind::BucketLaunch && it->bucket.seq == e.coll.seq) {
              tip_row("carries", "DDP bucket %d: %s", it->bucket.bucket, label_of(s, it->bucket.label));
              break;
            }
        break;
      case EventKind::RingStep:
        tip_row("phase", "%s", ring_phase_name(e.step.phase));
        tip_row("step", "%d of %d  (collective #%llu)", e.step.step + 1, e.step.steps, static_cast<unsigned long long>(e.step.seq));
        if (e.step.chunk >= 0) tip_row("chunk", "%d", e.step.chunk);
        tip_row("transfer", "rank %d -> rank %d", e.step.src, e.step.dst);
        tip_row("received", "%s", human_bytes(e.step.bytes).c_str());
        break;
      case EventKind::GradReady:
        tip_row("parameter", "%s", label_of(s, e.bucket.label));
        tip_row("gradient", "%s", human_bytes(e.bucket.bytes).c_str());
        tip_row("bucket", "%d of %d", e.bucket.bucket, e.bucket.num_buckets);
        break;
      case EventKind::BucketLaunch:
        tip_row("all-reduce", "#%llu", static_cast<unsigned long long>(e.bucket.seq));
        tip_bucket(s, e.bucket, fs);
        break;
      default: break;
    }
    if (bucket_span) {
      if (e.kind == EventKind::BucketAllReduce)
        tip_row("all-reduce", "#%llu", static_cast<unsigned long long>(e.bucket.seq));
      if (e.kind != EventKind::BucketLaunch) tip_bucket(s, bucket_ev->bucket, fs);
    }
    ImGui::EndTable();
  }
  ImGui::EndTooltip();
}

void legend_item(ImU32 col, const char* text, bool& first, int glyph = 0) {
  const float fs = ImGui::GetFontSize();
  const float w = 1.1f * fs + ImGui::CalcTextSize(text).x;
  if (!first) {
    ImGui::SameLine(0, 0.9f * fs);
    if (ImGui::GetContentRegionAvail().x < w) ImGui::NewLine();
  }
  first = false;
  const ImVec2 p = ImGui::GetCursorScreenPos();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float y0 = p.y + 0.2f * fs, y1 = p.y + 0.9f * fs;
  if (glyph == 1) {  // tick
    dl->AddLine(ImVec2(p.x + 0.4f * fs, y0), ImVec2(p.x + 0.4f * fs, y1), col, 2.0f);
  } else if (glyph == 2) {  // triangle
    dl->AddTriangleFilled(ImVec2(p.x + 0.1f * fs, y0), ImVec2(p.x + 0.7f * fs, y0), ImVec2(p.x + 0.4f * fs, y1), col);
  } else if (glyph == 3) {  // hatch
    dl->AddRectFilled(ImVec2(p.x, y0), ImVec2(p.x + 0.8f * fs, y1), alpha(col, 0.25f));
    draw_hatch(dl, ImVec2(p.x, y0), ImVec2(p.x + 0.8f * fs, y1), col, 4.0f);
  } else if (glyph == 4) {  // overlap highlight
    dl->AddRectFilled(ImVec2(p.x, y0), ImVec2(p.x + 0.8f * fs, y1), alpha(col, 0.3f));
    dl->AddRectFilled(ImVec2(p.x, y0), ImVec2(p.x + 0.8f * fs, y0 + 3), col);
  } else {
    dl->AddRectFilled(ImVec2(p.x, y0), ImVec2(p.x + 0.8f * fs, y1), col);
  }
  ImGui::Dummy(ImVec2(fs, fs));
  ImGui::SameLine(0, 0.15f * fs);
  ImGui::TextUnformatted(text);
}

void draw_toolbar(ViewContext& ctx) {
  ImGui::Checkbox("Follow", &g_view.follow);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Keep the last two iterations in view (double-click the timeline to return here)");
  ImGui::SameLine();
  if (ImGui::RadioButton("modeled clock", ctx.modeled_clock)) ctx.modeled_clock = true;
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Time as the hardware profile's cost model charges it");
  ImGui::SameLine();
  if (ImGui::RadioButton("wall clock", !ctx.modeled_clock)) ctx.modeled_clock = false;
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Time as this machine's threads really took it");
  ImGui::SameLine();
  ImGui::TextDisabled("%s in view", time_text(g_view.t1 - g_view.t0).c_str());
  ImGui::SameLine();
  ImGui::TextDisabled("(?)");
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Wheel: zoom around the cursor.  Drag (left or middle): pan.\nDouble-click: follow the latest iterations again.\n"
                      "Hover a span for its details.");
  bool first = true;
  legend_item(kForward, "forward", first);
  legend_item(kBackward, "backward", first);
  legend_item(kLoss, "loss", first);
  legend_item(kOptimizer, "optimizer", first);
  legend_item(kCollective, "collective", first);
  legend_item(kBucket, "bucket all-reduce", first);
  legend_item(kRingScatter, "reduce-scatter", first);
  legend_item(kRingGather, "all-gather", first);
  legend_item(kOverlap, "all-reduce under backward", first, 4);
  legend_item(kGradReady, "grad ready", first, 1);
  legend_item(kBucket, "bucket launch", first, 2);
  legend_item(kPaused, "paused", first, 3);
}

}  // namespace

void draw_timeline_view(const Snapshot& s, ViewContext& ctx) {
  const float fs = ImGui::GetFontSize();
  const Clock clock{ctx.modeled_clock};
  if (g_view.modeled != ctx.modeled_clock) g_view.modeled = ctx.modeled_clock, g_view.follow = true;
  const int ranks = static_cast<int>(s.events.size());

  // Every rank's rows, brought up to date with what is new; then what "follow" shows: rank 0's
  // last two iterations, to the end of everything recorded.
  static std::vector<RankCache> caches;
  if (caches.size() != static_cast<size_t>(ranks)) caches.assign(static_cast<size_t>(ranks), RankCache{});
  double t_min = DBL_MAX, t_max = -DBL_MAX;
  for (int r = 0; r < ranks; r++) {
    RankCache& c = caches[static_cast<size_t>(r)];
    scan_rank(c, s.events[static_cast<size_t>(r)], clock);
    t_min = std::min(t_min, c.t_min), t_max = std::max(t_max, c.t_max);
  }
  static const std::vector<IterExtent> kNone;
  const std::vector<IterExtent>& iters0 = ranks > 0 ? caches[0].iters : kNone;
  if (!g_view.follow && t_max > -DBL_MAX && t_max < g_view.t0) g_view.follow = true;  // a new run restarted the clock
  auto follow_range = [&] {
    double b = 0, e = 1e-3;
    if (!iters0.empty()) {
      b = iters0.size() >= 2 ? iters0[iters0.size() - 2].b : iters0.back().b;
      e = std::max(t_max, iters0.back().e);
    } else if (t_max > t_min) {
      b = t_min, e = t_max;
    }
    const double span = std::max(e - b, 1e-9);
    g_view.t0 = b - 0.02 * span, g_view.t1 = e + 0.08 * span;
  };
  if (g_view.follow) follow_range();

  draw_toolbar(ctx);

  const float ruler_h = 1.45f * fs, strip_h = 1.35f * fs, header_h = ruler_h + strip_h;
  ImVec2 avail = ImGui::GetContentRegionAvail();
  const float natural = std::max(ranks, 1) * make_layout(fs, 1.0f).rank_h;
  const Layout L = make_layout(fs, std::clamp((avail.y - header_h - 4) / natural, 1.0f, 1.6f));
  avail.x = std::max(avail.x, L.label_w + 4 * fs);
  avail.y = std::max(avail.y, header_h + L.rank_h);
  const ImVec2 hp = ImGui::GetCursorScreenPos();
  const ImGuiButtonFlags buttons = ImGuiButtonFlags_MouseButtonLeft | ImGuiButtonFlags_MouseButtonMiddle;
  ImGui::InvisibleButton("##tl_header", ImVec2(avail.x, header_h), buttons);
  ImGui::SetItemUsingMouseWheel();
  const bool header_hovered = ImGui::IsItemHovered(), header_active = ImGui::IsItemActive();

  ImGui::BeginChild("##tl_lanes", ImVec2(avail.x, avail.y - header_h), false, ImGuiWindowFlags_NoScrollWithMouse);
  const ImVec2 cp = ImGui::GetCursorScreenPos();
  const float cw = std::max(ImGui::GetContentRegionAvail().x, L.label_w + 4 * fs);
  const float total_h = std::max(static_cast<float>(ranks) * L.rank_h, 1.0f);
  ImGui::InvisibleButton("##tl_canvas", ImVec2(cw, std::max(total_h, ImGui::GetContentRegionAvail().y)), buttons);
  ImGui::SetItemUsingMouseWheel();
  const bool canvas_hovered = ImGui::IsItemHovered(), canvas_active = ImGui::IsItemActive();

  // Input: wheel zooms around the cursor's time, dragging pans (and scrolls the ranks).
  ImGuiIO& io = ImGui::GetIO();
  Axis ax;
  ax.x0 = cp.x + L.label_w, ax.x1 = cp.x + cw;
  auto set_axis = [&] {
    ax.t0 = g_view.t0, ax.t1 = g_view.t1;
    ax.px_per_s = static_cast<double>(ax.x1 - ax.x0) / std::max(ax.t1 - ax.t0, 1e-12);
  };
  set_axis();
  if ((header_hovered || canvas_hovered) && io.MouseWheel != 0) {
    const double tm = ax.t(std::clamp(io.MousePos.x, ax.x0, ax.x1));
    const double range = ax.t1 - ax.t0;
    const double f = std::clamp(std::pow(1.25, -static_cast<double>(io.MouseWheel)), 1e-9 / range, 1e4 / range);
    g_view.t0 = tm - (tm - ax.t0) * f, g_view.t1 = tm + (ax.t1 - tm) * f;
    g_view.follow = false;
  }
  if ((header_active || canvas_active) &&
      (ImGui::IsMouseDragging(ImGuiMouseButton_Left, 1.0f) || ImGui::IsMouseDragging(ImGuiMouseButton_Middle, 1.0f))) {
    if (io.MouseDelta.x != 0) {
      const double dt = -static_cast<double>(io.MouseDelta.x) / ax.px_per_s;
      g_view.t0 += dt, g_view.t1 += dt;
      g_view.follow = false;
    }
    if (canvas_active && io.MouseDelta.y != 0) ImGui::SetScrollY(ImGui::GetScrollY() - io.MouseDelta.y);
  }
  if ((header_hovered || canvas_hovered) && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) {
    g_view.follow = true;
    follow_range();
  }
  set_axis();
  const Ticks ticks = make_ticks(ax, fs);

  // Lanes.
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 wp = ImGui::GetWindowPos();
  const float wy0 = wp.y, wy1 = wp.y + ImGui::GetWindowHeight();
  const ImVec2 mouse = io.MousePos;
  Hover hover;
  dl->PushClipRect(ImVec2(ax.x0, wy0), ImVec2(ax.x1, wy1), true);
  for (int64_t k = ticks.k0; k <= ticks.k1; k++) {
    const float x = std::floor(ax.x(static_cast<double>(k) * ticks.step)) + 0.5f;
    vline(dl, x, cp.y, cp.y + total_h, IM_COL32(255, 255, 255, 14));
  }
  static Derived derived;
  const double t_lo = ax.t(ax.x0 - 4), t_hi = ax.t(ax.x1 + 4);
  for (int r = 0; r < ranks; r++) {
    const float y = cp.y + static_cast<float>(r) * L.rank_h;
    if (y > wy1 || y + L.rank_h < wy0) continue;  // scrolled out of the panel
    const std::vector<Event>& evs = s.events[static_cast<size_t>(r)];
    derive(caches[static_cast<size_t>(r)], evs, clock, t_lo, t_hi, derived);
    RowCtx rc{dl, ax, evs, mouse, canvas_hovered, hover, r, fs};
    draw_rank(s, caches[static_cast<size_t>(r)], derived, r, y, L, rc);
  }
  if (canvas_hovered || header_hovered)
    vline(dl, mouse.x, cp.y, cp.y + total_h, IM_COL32(255, 255, 255, 90));
  dl->PopClipRect();
  for (int r = 0; r < ranks; r++) {
    const float y = cp.y + static_cast<float>(r) * L.rank_h;
    if (y > wy1 || y + L.rank_h < wy0) continue;
    draw_rank_labels(s, r, cp.x, y, L, dl);
  }
  if (ranks == 0) dl->AddText(ImVec2(ax.x0 + fs, cp.y + fs), ImGui::GetColorU32(ImGuiCol_TextDisabled), "No events yet.");

  if (canvas_hovered && !ImGui::IsMouseDragging(ImGuiMouseButton_Left, 1.0f)) {
    if (hover.kind == Hover::Ev || hover.kind == Hover::Merged) {
      event_tooltip(s, hover, fs);
    } else if (hover.kind == Hover::Overlap) {
      ImGui::BeginTooltip();
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kOverlap), "all-reduce hidden behind backward");
      ImGui::Text("rank %d: %s, from %s", hover.rank, time_text(hover.span.e - hover.span.b).c_str(), time_text(hover.span.b).c_str());
      ImGui::TextDisabled("A bucket's gradients are summed across ranks while backward is still\n"
                          "computing the earlier layers: this communication costs no step time.");
      ImGui::EndTooltip();
    } else if (hover.kind == Hover::Paused) {
      ImGui::SetTooltip("rank %d is held at a %s gate since %s.\nStep or run to release it.", hover.rank, hover.what,
                        time_text(hover.span.b).c_str());
    }
  }
  ImGui::EndChild();

  // Header: the ruler and rank 0's iterations, on the parent window.
  ImDrawList* hdl = ImGui::GetWindowDrawList();
  hdl->PushClipRect(ImVec2(ax.x0, hp.y), ImVec2(ax.x1, hp.y + header_h), true);
  const bool show_cursor = header_hovered || canvas_hovered;
  const std::string cursor_text = show_cursor ? fmt_time_at(ax.t(mouse.x), 1.0 / ax.px_per_s) : std::string();
  const ImVec2 cursor_size = ImGui::CalcTextSize(cursor_text.c_str());
  const float cursor_x = std::min(std::floor(mouse.x) + 4.5f, ax.x1 - cursor_size.x - 6);
  draw_ruler(hdl, ax, ticks, hp.y, hp.y + ruler_h, fs,
             show_cursor ? ImVec2(cursor_x - 4, cursor_x + cursor_size.x + 6) : ImVec2(FLT_MAX, -FLT_MAX));
  const float sy0 = hp.y + ruler_h, sy1 = hp.y + header_h;
  const IterExtent* hovered_iter = nullptr;
  for (const IterExtent& it : iters0) {
    const float a = ax.x(it.b), b = ax.x(it.e);
    if (b < ax.x0 || a > ax.x1) continue;
    hdl->AddRectFilled(ImVec2(a, sy0 + 2), ImVec2(b, sy1 - 1), IM_COL32(255, 255, 255, it.iter % 2 ? 30 : 16));
    vline(hdl, a, sy0 + 2, sy1 - 1, IM_COL32(255, 255, 255, 110));
    char text[64];
    const double ov = overlap_of(s, it.iter);
    if (!it.complete) std::snprintf(text, sizeof text, "iter %d (running)", it.iter);
    else if (ov >= 0) std::snprintf(text, sizeof text, "iter %d \xC2\xB7 overlap %.0f%%%s", it.iter, 100 * ov, ctx.modeled_clock ? "" : " (modeled)");
    else std::snprintf(text, sizeof text, "iter %d", it.iter);
    const float tx = std::max(a, ax.x0) + 0.35f * fs;
    const ImVec4 clip(a, sy0, std::min(b, ax.x1), sy1);
    if (clip.z - tx > 2.5f * fs)  // a sliver of a label reads as noise
      hdl->AddText(ImGui::GetFont(), fs, ImVec2(tx, sy0 + (strip_h - fs) * 0.5f + 1), ImGui::GetColorU32(ImGuiCol_Text), text,
                 nullptr, 0, &clip);
    if (header_hovered && mouse.x >= a && mouse.x <= b && mouse.y >= sy0) hovered_iter = &it;
  }
  if (show_cursor) {
    const float x = std::floor(mouse.x) + 0.5f;
    vline(hdl, x, hp.y, sy1, IM_COL32(255, 255, 255, 120));
    hdl->AddRectFilled(ImVec2(cursor_x - 2, hp.y + 1), ImVec2(cursor_x + cursor_size.x + 4, hp.y + 1 + cursor_size.y),
                       IM_COL32(40, 44, 52, 240));
    hdl->AddText(ImVec2(cursor_x + 1, hp.y + 1 + 0.15f * fs), IM_COL32(255, 236, 140, 255), cursor_text.c_str());
  }
  hdl->PopClipRect();
  hdl->AddText(ImVec2(hp.x + 0.3f * fs, hp.y + 0.2f * fs), ImGui::GetColorU32(ImGuiCol_TextDisabled),
               ctx.modeled_clock ? "modeled" : "wall");
  hdl->AddText(ImVec2(hp.x + 0.3f * fs, sy0 + (strip_h - fs) * 0.5f + 1), ImGui::GetColorU32(ImGuiCol_TextDisabled), "rank 0");
  if (hovered_iter && !ImGui::IsMouseDragging(ImGuiMouseButton_Left, 1.0f)) {
    const double ov = overlap_of(s, hovered_iter->iter);
    ImGui::BeginTooltip();
    ImGui::Text("iteration %d%s", hovered_iter->iter, hovered_iter->complete ? "" : " (running)");
    ImGui::TextDisabled("rank 0, %s clock", ctx.modeled_clock ? "modeled" : "wall");
    ImGui::Text("%s  from %s", time_text(hovered_iter->e - hovered_iter->b).c_str(), time_text(hovered_iter->b).c_str());
    if (ov >= 0) ImGui::Text("overlap %.0f%%: share of all-reduce time hidden behind backward", 100 * ov);
    ImGui::EndTooltip();
  }
}

}  // namespace dtlab::app
