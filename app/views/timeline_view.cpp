// The timeline, Tracy style: per rank a compute lane (forward, backward, loss and optimizer ops, with
// gradient-ready and launch ticks) and a comm lane (collectives, DDP bucket all-reduces, ring steps),
// over faint iteration bands. The comm lane is lit where a bucket's all-reduce runs while backward
// is still computing: the overlap DDP's buckets exist for. Wheel zooms around the cursor, dragging
// pans; until then the view follows the latest iterations. Each rank's rows (app/timeline_index.h)
// are kept between frames and extended with the new events only; drawing culls by binary search and
// merges spans under a pixel, so a frame costs about what is on screen, whatever the window holds.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <string>
#include <vector>

#include "app/views/timeline_canvas.h"
#include "app/views/timeline_view.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

// The stepper gate a timeline lane of `rank` waits at, or null: the compute row shows the compute
// thread's gate, the comm row its comm worker's or group executor's (engine/trace/stepper.h lanes).
const RankGateState* held_gate(const StepperState& st, int rank, int lane) {
  for (int l : lane == 0 ? std::vector<int>{kComputeLane} : std::vector<int>{kCommLane, kGroupLane}) {
    const size_t gi = static_cast<size_t>(rank * kStepperLanes + l);
    if (gi < st.gates.size() && st.gates[gi].blocked) return &st.gates[gi];
  }
  return nullptr;
}

// ---- colors: the kinds of work take the palette's work_color(), so the legend holds for every rank
// (ranks own the lane chips); these are the live timeline's own
constexpr ImU32 kOtherCompute = IM_COL32(128, 132, 142, 255);
constexpr ImU32 kRecompute = IM_COL32(214, 84, 112, 255);  // activation checkpointing's forward again
constexpr ImU32 kBucket = IM_COL32(206, 118, 222, 255);
constexpr ImU32 kRingScatter = IM_COL32(36, 132, 140, 255);
constexpr ImU32 kRingGather = IM_COL32(120, 222, 222, 255);
constexpr ImU32 kPaused = IM_COL32(150, 150, 156, 255);
constexpr ImU32 kGradReady = IM_COL32(236, 236, 236, 220);
constexpr ImU32 kSpanText = IM_COL32(16, 18, 22, 255);
constexpr ImU32 kScaleTick = IM_COL32(150, 200, 150, 150);  // fp16: a loss scale decision that kept the step

ImU32 alpha(ImU32 c, float a) {
  const ImU32 v = static_cast<ImU32>(a * static_cast<float>((c >> IM_COL32_A_SHIFT) & 0xFF) + 0.5f);
  return (c & ~IM_COL32_A_MASK) | (std::min<ImU32>(v, 255) << IM_COL32_A_SHIFT);
}

ImU32 compute_color(ComputeKind k) {
  switch (k) {
    case ComputeKind::LayerForward: return work_color(Work::Forward);
    case ComputeKind::LayerBackward: return work_color(Work::Backward);
    case ComputeKind::Loss: return work_color(Work::Loss);
    case ComputeKind::LossBackward: return darker(work_color(Work::Loss), 0.82f);
    case ComputeKind::OptimizerStep: return work_color(Work::Optimizer);
    case ComputeKind::Recompute: return kRecompute;
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
    case ComputeKind::Recompute: return "re";
    default: return "op";
  }
}

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

// A process group's name, "tp0" (CollectiveInfo::group, 0 for the world: "").
// The group a collective ran in, as every view names it: "tp0", "dp1", or "world" (group 0).
std::string group_name_of(const Snapshot& s, int32_t group) {
  std::string name;
  std::vector<int> ranks;
  if (group <= 0) return "world";
  return parse_group_label(label_of(s, group - 1), name, ranks) ? name : "group";
}


// ---- drawing
struct Hover {
  enum Kind { None, Ev, Merged, Overlap, Paused } kind = None;
  RowSpan span;
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
  const TimeAxis& ax;
  const std::vector<Event>& evs;
  ImVec2 mouse;
  bool mouse_in;
  Hover& hover;
  int rank;
  float text_size;
  const Roof* roof = nullptr;  // colour spans by their fraction of it (the toolbar's "% of peak"); null: by kind
};

// A compute or collective span's colour under "% of peak": its achieved rate over the roof at its
// intensity (roofline.h), on the palette's red-to-green ramp; spans with no cost keep `fallback`.
ImU32 peak_color(const Event& e, const Roof& roof, ImU32 fallback) {
  RooflinePoint p;
  return roofline_point(e, p) ? roof_fraction_color(fraction_of_roof(p, roof)) : fallback;
}

// Draws one row of spans in [y0, y1]. Spans under a pixel merge with their neighbours into one
// block, and a run of them is skipped with a binary search, so a zoomed-out view of thousands of
// ops costs about one rectangle per pixel column.
template <class ColorFn, class LabelFn>
void draw_row(RowCtx& rc, SpanRange range, float y0, float y1, ColorFn color_of, LabelFn label_of) {
  const TimeAxis& ax = rc.ax;
  float run_x0 = 0, run_x1 = 0;
  int run_n = 0;
  const RowSpan* run_first = nullptr;
  double run_b = 0, run_e = 0;
  auto hit = [&](float a, float b) {
    return rc.mouse_in && rc.mouse.x >= a - 1 && rc.mouse.x <= b + 1 && rc.mouse.y >= y0 && rc.mouse.y <= y1;
  };
  auto ev = [&](const RowSpan& sp) -> const Event& { return rc.evs[static_cast<size_t>(sp.idx)]; };
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
  for (const RowSpan* sp = range.first; sp < range.last; ++sp) {
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
      const RowSpan* j = std::partition_point(sp + 1, range.last, [t_next](const RowSpan& x) { return x.b <= t_next; });
      if (j - sp > 2) {
        const RowSpan* last_narrow = j - 2;
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
  const TimeAxis& ax = rc.ax;
  for (const RowSpan* sp = range.first; sp < range.last;) {
    const float x = std::floor(ax.x(sp->b)) + 0.5f;
    glyph(x);
    if (rc.mouse_in && std::fabs(rc.mouse.x - x) <= std::max(3.0f, half_w) && rc.mouse.y >= y0 && rc.mouse.y <= y1)
      rc.hover.kind = Hover::Ev, rc.hover.span = *sp, rc.hover.rank = rc.rank;
    const double t_next = ax.t(x + 0.5f);
    sp = std::partition_point(sp + 1, range.last, [t_next](const RowSpan& s) { return s.b < t_next; });
  }
}

// Lane geometry in "lane units" u: the font size, stretched (up to 1.6x) when the ranks would
// leave the panel half empty. Row offsets are from the top of their lane.
struct TimelineLayout {
  float fs = 13, u = 13, label_w = 100;
  float compute_h = 0, comm_h = 0, gap = 0, rank_h = 0;
  float op0 = 0, op1 = 0;  // compute lane: ops (instants below, to the lane's end)
  float ov0 = 0, ov1 = 0;  // comm lane: the overlap marker
  float co0 = 0, co1 = 0;  // collectives
  float bu0 = 0, bu1 = 0;  // bucket all-reduces
  float ri0 = 0, ri1 = 0;  // ring steps
};

TimelineLayout make_layout(float fs, float stretch) {
  TimelineLayout L;
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

// fp16's GradScaler decisions on the compute lane. A skipped step: a red flag where the ranks agreed
// to skip, and a red bar over the slot the optimizer step would have taken (to the iteration's end),
// labelled when it fits; a kept step: a faint tick in the instants' strip.
void draw_loss_scale(RowCtx& rc, const RankRows& c, SpanRange range, float yc, float bar0, float bar1, float strip0, float ym) {
  ImDrawList* dl = rc.dl;
  const TimeAxis& ax = rc.ax;
  const float fs = rc.text_size;
  for (const RowSpan* sp = range.first; sp < range.last; ++sp) {
    const Event& e = rc.evs[static_cast<size_t>(sp->idx)];
    const float x = std::floor(ax.x(sp->b)) + 0.5f;
    if (!e.scaler.skipped) {
      vline(dl, x - 0.5f, strip0 + 2, ym - 1, kScaleTick, 1.0f);
      if (rc.mouse_in && std::fabs(rc.mouse.x - x) <= 3.0f && rc.mouse.y >= strip0 && rc.mouse.y <= ym)
        rc.hover.kind = Hover::Ev, rc.hover.span = *sp, rc.hover.rank = rc.rank;
      continue;
    }
    double end = sp->b;
    for (const IterExtent& it : c.iters)
      if (it.iter == e.iteration) end = std::max(end, it.e);
    const float x1 = std::min(std::max(ax.x(end), x + 0.5f * fs), ax.x1 + 4);
    dl->AddRectFilled(ImVec2(x, bar0), ImVec2(x1, bar1), alpha(skipped_step_color(), 0.35f));
    draw_hatch(dl, ImVec2(x, bar0), ImVec2(x1, bar1), alpha(skipped_step_color(), 0.8f), 5.0f);
    vline(dl, x - 1.0f, yc, ym, skipped_step_color(), 2.0f);
    const float fh = 0.45f * (bar1 - bar0);  // the flag's pennant at the top of the line
    dl->AddTriangleFilled(ImVec2(x, yc), ImVec2(x + 0.9f * fh, yc + 0.5f * fh), ImVec2(x, yc + fh), skipped_step_color());
    char text[48];
    std::snprintf(text, sizeof text, "step %d skipped", e.iteration + 1);
    for (const char* t : {static_cast<const char*>(text), "skipped"}) {  // light text: the bar is dark red
      const float tw = ImGui::CalcTextSize(t).x;
      if (x + fh + tw + 4 > x1) continue;
      dl->AddText(ImVec2(std::max(x + fh + 2, (x + x1 - tw) * 0.5f), bar0 + (bar1 - bar0 - fs) * 0.5f), IM_COL32(255, 255, 255, 240), t);
      break;
    }
    if (rc.mouse_in && rc.mouse.x >= x - 3 && rc.mouse.x <= x1 && rc.mouse.y >= yc && rc.mouse.y <= ym)
      rc.hover.kind = Hover::Ev, rc.hover.span = *sp, rc.hover.rank = rc.rank;
  }
}

void draw_rank(const Snapshot& s, const RankRows& c, const FrameSpans& d, int rank, float y, const TimelineLayout& L, RowCtx& rc) {
  ImDrawList* dl = rc.dl;
  const TimeAxis& ax = rc.ax;
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
  for (const TimeInterval& o : d.overlap) {
    const float a = std::max(ax.x(o.b), ax.x0), b = std::max(std::min(ax.x(o.e), ax.x1), a + 1);
    dl->AddRectFilled(ImVec2(a, ym + L.ov1), ImVec2(b, ye), alpha(work_color(Work::CommUnderCompute), 0.22f));
    dl->AddRectFilled(ImVec2(a, ym + L.ov0), ImVec2(b, ym + L.ov1), work_color(Work::CommUnderCompute));
    if (rc.mouse_in && rc.mouse.x >= a && rc.mouse.x <= b && rc.mouse.y >= ym && rc.mouse.y <= ye)
      rc.hover.kind = Hover::Overlap, rc.hover.span = RowSpan{o.b, o.e}, rc.hover.rank = rank;
  }
  const double t0 = ax.t(ax.x0 - 4), t1 = ax.t(ax.x1 + 4);
  // Compute lane: ops, then instants in the strip under them.
  const float bar0 = yc + L.op0, bar1 = yc + L.op1;
  draw_row(rc, visible_spans(c.compute, t0, t1), bar0, bar1,
           [&rc](const RowSpan&, const Event& e) {
             return rc.roof ? peak_color(e, *rc.roof, kOtherCompute) : compute_color(e.compute.kind);
           },
           [](const RowSpan&, const Event& e, char* l, size_t ln, char* sh, size_t sn) {
             const ComputeInfo& ci = e.compute;
             if (ci.layer >= 0) {
               std::snprintf(l, ln, "%s %d", compute_kind_name(ci.kind), ci.layer);
               std::snprintf(sh, sn, "%s %d", compute_short(ci.kind), ci.layer);
             } else {
               std::snprintf(l, ln, "%s", compute_kind_name(ci.kind));
               std::snprintf(sh, sn, "%s", compute_short(ci.kind));
             }
           });
  const float strip0 = bar1 + 1, strip1 = ym - 1, wi = 0.22f * L.u, wl = 0.3f * L.u;
  draw_instants(rc, visible_spans(c.grad_ready, t0, t1), strip0, ym, 0, [&](float x) {
    vline(dl, x - 0.5f, strip0 + 1, strip1, kGradReady, 2.0f);
  });
  draw_instants(rc, visible_spans(c.issues, t0, t1), strip0, ym, wi, [&](float x) {
    dl->AddTriangleFilled(ImVec2(x - wi, strip0), ImVec2(x + wi, strip0), ImVec2(x, strip1 + 1), work_color(Work::Communication));
  });
  draw_instants(rc, visible_spans(c.launch_marks, t0, t1), strip0, ym, wl, [&](float x) {
    dl->AddTriangleFilled(ImVec2(x - wl, strip0), ImVec2(x + wl, strip0), ImVec2(x, strip1 + 1), kBucket);
  });
  // Comm lane: collectives (and the one in flight), the bucket each all-reduce carries, ring steps.
  auto coll_label = [&s](const RowSpan& sp, const Event& e, char* l, size_t ln, char* sh, size_t sn) {
    const bool info = e.kind != EventKind::RingStep;
    const unsigned long long seq = info ? e.coll.seq : e.step.seq;
    const char* op = info ? collective_name(e.coll.op) : "collective";
    // Every collective says which group counted it: "allreduce tp0 #3", "allreduce world #5".
    const std::string group = group_name_of(s, info ? e.coll.group : e.step.group);
    if (sp.in_flight) std::snprintf(l, ln, "%s %s #%llu: %d steps done", op, group.c_str(), seq, sp.steps_done);
    else std::snprintf(l, ln, "%s %s #%llu %s", op, group.c_str(), seq, algorithm_name(e.coll.algo));
    std::snprintf(sh, sn, "%s #%llu", group.c_str(), seq);
  };
  auto coll_color = [&rc](const RowSpan& sp, const Event& e) {
    return rc.roof && e.kind == EventKind::Collective && !sp.in_flight ? peak_color(e, *rc.roof, work_color(Work::Communication))
                                                                       : work_color(Work::Communication);
  };
  draw_row(rc, visible_spans(c.coll, t0, t1), ym + L.co0, ym + L.co1, coll_color, coll_label);
  draw_row(rc, SpanRange{d.coll_tail.data(), d.coll_tail.data() + d.coll_tail.size()}, ym + L.co0, ym + L.co1, coll_color,
           coll_label);
  const float text_size = rc.text_size;
  rc.text_size = std::min(0.8f * L.u, fs);
  const std::vector<Event>& evs = rc.evs;
  draw_row(rc, SpanRange{d.bucket.data(), d.bucket.data() + d.bucket.size()}, ym + L.bu0, ym + L.bu1,
           [](const RowSpan&, const Event&) { return kBucket; },
           [&evs](const RowSpan& sp, const Event& e, char* l, size_t ln, char* sh, size_t sn) {
             const Event& src = sp.extra >= 0 ? evs[static_cast<size_t>(sp.extra)] : e;
             std::snprintf(l, ln, "bucket %d", src.bucket.bucket);
             std::snprintf(sh, sn, "b%d", src.bucket.bucket);
           });
  rc.text_size = text_size;
  draw_row(rc, visible_spans(c.ring, t0, t1), ym + L.ri0, ym + L.ri1,
           [](const RowSpan&, const Event& e) {
             switch (e.step.phase) {
               case RingPhase::ReduceScatter:
               case RingPhase::Reduce: return kRingScatter;
               case RingPhase::AllGather:
               case RingPhase::Broadcast: return kRingGather;
               default: return darker(work_color(Work::Communication), 0.8f);
             }
           },
           [](const RowSpan&, const Event&, char*, size_t, char*, size_t) {});
  // Gates: time a rank spent held by the stepper, hatched grey.
  const SpanRange gates = visible_spans(c.gate, t0, t1);
  for (const RowSpan* sp = gates.first; sp < gates.last; ++sp) {
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
      const RankGateState* held = held_gate(s.stepper, rank, lane);
      if (!held) continue;
      const double from = c.frontier[lane] > -DBL_MAX ? c.frontier[lane] : ax.t0;
      const float a = std::max(ax.x(from), ax.x0), b = ax.x1;
      if (b <= a) continue;
      const float g0 = lane ? ym + L.co0 : bar0, g1 = lane ? ym + L.ri1 : bar1;
      dl->AddRectFilled(ImVec2(a, g0), ImVec2(b, g1), alpha(kPaused, 0.12f));
      draw_hatch(dl, ImVec2(a, g0), ImVec2(b, g1), alpha(kPaused, 0.45f), 7.0f);
      vline(dl, a, g0, g1, kPaused, 2.0f);
      const char* what = gate_kind_name(held->gate.kind);
      char text[64];
      std::snprintf(text, sizeof text, "paused at %s gate", what);
      const float tw = ImGui::CalcTextSize(text).x;
      if (b - a > tw + 8) {
        const ImVec2 tp(a + 6, g0 + (L.co1 - L.co0 - fs) * 0.5f);
        dl->AddRectFilled(ImVec2(tp.x - 2, tp.y), ImVec2(tp.x + tw + 2, tp.y + fs), IM_COL32(30, 30, 34, 220));
        dl->AddText(tp, IM_COL32(220, 220, 226, 255), text);
      }
      if (rc.mouse_in && rc.mouse.x >= a && rc.mouse.x <= b && rc.mouse.y >= g0 && rc.mouse.y <= g1)
        rc.hover.kind = Hover::Paused, rc.hover.span = RowSpan{from, from}, rc.hover.rank = rank, rc.hover.what = what;
    }
  draw_loss_scale(rc, c, visible_spans(c.loss_scale, t0, t1), yc, bar0, bar1, strip0, ym);  // over a gate's hatch
}

// The label column, drawn over whatever spans scrolled under it.
void draw_rank_labels(const Snapshot& s, int rank, float x, float y, const TimelineLayout& L, ImDrawList* dl) {
  const float fs = L.fs;
  const int world = std::max(1, s.config.world);
  const float ym = y + L.compute_h, ye = ym + L.comm_h;
  draw_rank_label_bg(dl, rank, world, x, y, ye, L.label_w, fs);
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
      if (!held_gate(s.stepper, rank, lane)) continue;
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

Ticks make_ticks(const TimeAxis& ax, float fs) {
  Ticks t;
  const double raw = 7.0 * fs / ax.px_per_unit;
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
void draw_ruler(ImDrawList* dl, const TimeAxis& ax, const Ticks& tk, float y0, float y1, float fs, ImVec2 keep_out) {
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
    if (x + 3 < ax.x0 || x + 3 + w > ax.x1) continue;  // a label the ruler's ends would cut: its tick alone
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

// The span's achieved rate and its share of the roof, on the wall clock (what the device really did).
void tip_roof(const Snapshot& s, const Event& e) {
  RooflinePoint p;
  if (!s.config.roof.valid() || !roofline_point(e, p)) return;
  tip_row("achieved", "%s, %s", si_text(p.flops_per_s(), "FLOP/s").c_str(), si_text(p.bytes_per_s(), "B/s").c_str());
  tip_row("of peak", "%.1f%% (%s)", 100 * fraction_of_roof(p, s.config.roof),
          p.flops > 0 && p.intensity() >= s.config.roof.ridge() ? "FLOP/s ceiling" : "memory bandwidth");
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

// GradScaler.update (docs/course_sources.md §6e): a skip halves the scale (backoff 0.5) and resets
// the growth tracker; 2000 finite steps in a row double it.
void tip_loss_scale(const LossScaleInfo& l) {
  tip_row("this rank", "%s", l.found_inf ? "found an inf/NaN in its gradients" : "found its gradients finite");
  tip_row("all ranks", "%s", l.skipped ? "skip the optimizer step (one found inf/NaN)" : "step");
  tip_row("loss scale", "%.0f -> %.0f%s", static_cast<double>(l.scale), static_cast<double>(l.next_scale),
          l.next_scale < l.scale ? "  (halved)" : l.next_scale > l.scale ? "  (doubled)" : "");
  tip_row("growth tracker", "%lld finite steps in a row", static_cast<long long>(l.growth_tracker));
}

void event_tooltip(const Snapshot& s, const Hover& h, float fs) {
  const RowSpan& sp = h.span;
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
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(work_color(Work::Communication)), "%s %s #%llu", collective_name(e.coll.op),
                           group_name_of(s, e.coll.group).c_str(), static_cast<unsigned long long>(e.coll.seq));
        break;
      case EventKind::CollectiveIssue:
        ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(work_color(Work::Communication)), sp.in_flight ? "%s %s #%llu in flight" : "%s %s #%llu issued",
                           collective_name(e.coll.op), group_name_of(s, e.coll.group).c_str(), static_cast<unsigned long long>(e.coll.seq));
        break;
      case EventKind::RingStep:
        if (sp.in_flight)
          ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(work_color(Work::Communication)), "collective %s #%llu in flight",
                             group_name_of(s, e.step.group).c_str(), static_cast<unsigned long long>(e.step.seq));
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
      case EventKind::LossScale:
        if (e.scaler.skipped)
          ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(skipped_step_color()), "step %d skipped: inf/NaN in the gradients", e.iteration + 1);
        else
          ImGui::Text("step %d: gradients finite, the optimizer steps", e.iteration + 1);
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
        if (e.compute.bytes > 0) tip_row("bytes", "%s (%.3g FLOP/byte)", si_text(e.compute.bytes, "B").c_str(), e.compute.flops / e.compute.bytes);
        tip_roof(s, e);
        break;
      case EventKind::Collective:
      case EventKind::CollectiveIssue:
        if (e.coll.group != 0) tip_row("group", "%s", describe_group_label(label_of(s, e.coll.group - 1)).c_str());
        tip_collective(e.coll);
        if (e.kind == EventKind::Collective) tip_roof(s, e);
        if (!bucket_span && e.coll.group == 0)  // a DDP bucket's all-reduce says which bucket it carries
          for (auto it = evs.rbegin(); it != evs.rend(); ++it)
            if (it->kind == EventKind::BucketLaunch && it->bucket.seq == e.coll.seq) {
              tip_row("carries", "DDP bucket %d: %s", it->bucket.bucket, label_of(s, it->bucket.label));
              break;
            }
        break;
      case EventKind::RingStep:
        if (e.step.group != 0) tip_row("group", "%s", describe_group_label(label_of(s, e.step.group - 1)).c_str());
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
      case EventKind::LossScale:
        tip_loss_scale(e.scaler);
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
  const float w = 1.15f * fs + ImGui::CalcTextSize(text).x;
  if (!first) flow(w, 0.9f * fs);
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

// `no_key`: the spans' colors are keyed elsewhere (A's side above B's in an A/B comparison).
void draw_toolbar(TimelineViewState& view, ViewContext& ctx, bool fp16, bool no_key, const Roof& roof) {
  ImGui::Checkbox("Follow", &view.follow);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Keep the last two iterations in view (double-click the timeline to return here)");
  ImGui::SameLine();
  if (ImGui::RadioButton("modeled clock", ctx.modeled_clock)) ctx.modeled_clock = true;
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Time as the hardware profile's cost model charges it");
  ImGui::SameLine();
  if (ImGui::RadioButton("wall clock", !ctx.modeled_clock)) ctx.modeled_clock = false;
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Time as this machine's threads really took it");
  // In presentation a tiled timeline has no line to spare: the box shows where it and the span in view
  // fit beside the clock (alone on the screen they do; `colour peak` sets it from a script either way).
  const float peak_w = ImGui::CalcTextSize("% of peak").x + ImGui::GetFrameHeight() + ImGui::GetStyle().ItemInnerSpacing.x;
  const float room = ImGui::GetWindowPos().x + ImGui::GetContentRegionMax().x - ImGui::GetItemRectMax().x - ImGui::GetStyle().ItemSpacing.x;
  const float span_w = ImGui::CalcTextSize((time_text(view.t1 - view.t0) + " in view (?)").c_str()).x + 2 * ImGui::GetStyle().ItemSpacing.x;
  if (roof.valid() && (!ctx.presentation || peak_w + span_w <= room)) {
    flow(peak_w);
    ImGui::Checkbox("% of peak", &view.by_peak);
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("Colour each layer and collective by its achieved rate over the roof of %s\n"
                        "(FLOP/s for GEMMs, bandwidth for element-wise ops and collectives; wall clock)", roof.device.c_str());
  } else if (!roof.valid()) {
    view.by_peak = false;
  }
  const std::string span = time_text(view.t1 - view.t0) + " in view (?)";
  flow(ImGui::CalcTextSize(span.c_str()).x + ImGui::GetStyle().ItemSpacing.x);  // a narrow tile: the next line
  ImGui::TextDisabled("%s in view", time_text(view.t1 - view.t0).c_str());
  ImGui::SameLine();
  ImGui::TextDisabled("(?)");
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Wheel: zoom around the cursor.  Drag (left or middle): pan.\nDouble-click: follow the latest iterations again.\n"
                      "Hover a span for its details.");
  if (view.by_peak && !no_key) {  // the ramp is the only key the colours have: shown in presentation too
    bool first = true;
    for (int pct : {0, 25, 50, 75, 100}) {
      char t[16];
      std::snprintf(t, sizeof t, "%d%%", pct);
      legend_item(roof_fraction_color(pct / 100.0), t, first);
    }
    const char* of = "of the roof";
    flow(ImGui::CalcTextSize(of).x);
    ImGui::TextDisabled("%s", of);
    return;
  }
  // Presentation: fewer words; the spans carry their own labels ("forward 2", "backward 2") and the
  // legend's 13 keys took a third of the tile.
  if ((ctx.presentation && !fp16) || no_key) return;
  bool first = true;
  legend_item(work_color(Work::Forward), "forward", first);
  legend_item(work_color(Work::Backward), "backward", first);
  legend_item(kRecompute, "recompute", first);
  legend_item(work_color(Work::Loss), "loss", first);
  legend_item(work_color(Work::Optimizer), "optimizer", first);
  legend_item(work_color(Work::Communication), "collective", first);
  legend_item(kBucket, "bucket all-reduce", first);
  legend_item(kRingScatter, "reduce-scatter", first);
  legend_item(kRingGather, "all-gather", first);
  legend_item(work_color(Work::CommUnderCompute), "all-reduce under backward", first, 4);
  legend_item(kGradReady, "grad ready", first, 1);
  legend_item(kBucket, "bucket launch", first, 2);
  legend_item(kPaused, "paused", first, 3);
  if (fp16) legend_item(skipped_step_color(), "skipped step (fp16)", first, 3);
}

// The lanes: the tick grid, every rank on screen (its spans derived for the range in view), the
// cursor's line, then the label column over them. What the mouse is over lands in `hover`.
void draw_lanes(const Snapshot& s, TimelineViewState& view, const TimelineCanvas& c, const TimeAxis& ax, const Ticks& ticks,
                const TimelineLayout& L, const EventClock& clock, Hover& hover) {
  const int ranks = static_cast<int>(s.events.size());
  const float fs = L.fs, total_h = c.lanes_h;
  const ImVec2 cp = c.lanes_pos, mouse = ImGui::GetIO().MousePos;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  dl->PushClipRect(ImVec2(ax.x0, c.window_y0), ImVec2(ax.x1, c.window_y1), true);
  for (int64_t k = ticks.k0; k <= ticks.k1; k++) {
    const float x = std::floor(ax.x(static_cast<double>(k) * ticks.step)) + 0.5f;
    vline(dl, x, cp.y, cp.y + total_h, IM_COL32(255, 255, 255, 14));
  }
  const double t_lo = ax.t(ax.x0 - 4), t_hi = ax.t(ax.x1 + 4);
  for (int r = 0; r < ranks; r++) {
    const float y = cp.y + static_cast<float>(r) * L.rank_h;
    if (!c.visible(y, L.rank_h)) continue;  // scrolled out of the panel
    const std::vector<Event>& evs = s.events[static_cast<size_t>(r)];
    const RankRows& rows = view.index.ranks[static_cast<size_t>(r)];
    derive_frame(rows, evs, clock, t_lo, t_hi, view.frame);
    RowCtx rc{dl, ax, evs, mouse, c.canvas_hovered, hover, r, fs, view.by_peak && s.config.roof.valid() ? &s.config.roof : nullptr};
    draw_rank(s, rows, view.frame, r, y, L, rc);
  }
  if (c.hovered()) vline(dl, mouse.x, cp.y, cp.y + total_h, IM_COL32(255, 255, 255, 90));
  dl->PopClipRect();
  for (int r = 0; r < ranks; r++) {
    const float y = cp.y + static_cast<float>(r) * L.rank_h;
    if (c.visible(y, L.rank_h)) draw_rank_labels(s, r, cp.x, y, L, dl);
  }
  if (ranks == 0) dl->AddText(ImVec2(ax.x0 + fs, cp.y + fs), ImGui::GetColorU32(ImGuiCol_TextDisabled), "No events yet.");
}

// The tooltip for what the mouse is over in the lanes.
void lane_tooltip(const Snapshot& s, const Hover& hover, float fs) {
  if (hover.kind == Hover::Ev || hover.kind == Hover::Merged) {
    event_tooltip(s, hover, fs);
  } else if (hover.kind == Hover::Overlap) {
    ImGui::BeginTooltip();
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(work_color(Work::CommUnderCompute)), "all-reduce hidden behind backward");
    ImGui::Text("rank %d: %s, from %s", hover.rank, time_text(hover.span.e - hover.span.b).c_str(), time_text(hover.span.b).c_str());
    ImGui::TextDisabled("A bucket's gradients are summed across ranks while backward is still\n"
                        "computing the earlier layers: this communication costs no step time.");
    ImGui::EndTooltip();
  } else if (hover.kind == Hover::Paused) {
    ImGui::SetTooltip("rank %d is held at a %s gate since %s.\nStep or run to release it.", hover.rank, hover.what,
                      time_text(hover.span.b).c_str());
  }
}

// Rank 0's iterations in the strip [sy0, sy0 + strip_h] under the ruler, each with the overlap DDP
// reported for it; returns the one under the mouse, or null.
// An iteration under way: "running", or "paused" while the stepper holds the world (the world
// does not run then, whatever the iteration's unfinished band suggests).
const char* unfinished_word(const Snapshot& s) {
  if (s.finished) return "stopped";
  return s.stepper.paused ? "paused" : "running";
}

const IterExtent* draw_iteration_strip(ImDrawList* hdl, const Snapshot& s, const std::vector<IterExtent>& iters0, const TimeAxis& ax,
                                       float sy0, float strip_h, bool header_hovered, bool modeled_clock) {
  const float fs = ImGui::GetFontSize(), sy1 = sy0 + strip_h;
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  const IterExtent* hovered_iter = nullptr;
  for (const IterExtent& it : iters0) {
    const float a = ax.x(it.b), b = ax.x(it.e);
    if (b < ax.x0 || a > ax.x1) continue;
    hdl->AddRectFilled(ImVec2(a, sy0 + 2), ImVec2(b, sy1 - 1), IM_COL32(255, 255, 255, it.iter % 2 ? 30 : 16));
    vline(hdl, a, sy0 + 2, sy1 - 1, IM_COL32(255, 255, 255, 110));
    char text[64];
    const double ov = overlap_of(s, it.iter);
    if (!it.complete) std::snprintf(text, sizeof text, "iter %d (%s)", it.iter, unfinished_word(s));
    else if (ov >= 0) std::snprintf(text, sizeof text, "iter %d \xC2\xB7 overlap %.0f%%%s", it.iter, 100 * ov, modeled_clock ? "" : " (modeled)");
    else std::snprintf(text, sizeof text, "iter %d", it.iter);
    const float tx = std::max(a, ax.x0) + 0.35f * fs;
    const ImVec4 clip(a, sy0, std::min(b, ax.x1), sy1);
    if (clip.z - tx > 2.5f * fs)  // a sliver of a label reads as noise
      hdl->AddText(ImGui::GetFont(), fs, ImVec2(tx, sy0 + (strip_h - fs) * 0.5f + 1), ImGui::GetColorU32(ImGuiCol_Text), text,
                 nullptr, 0, &clip);
    if (header_hovered && mouse.x >= a && mouse.x <= b && mouse.y >= sy0) hovered_iter = &it;
  }
  return hovered_iter;
}

void iteration_tooltip(const Snapshot& s, const IterExtent& it, bool modeled_clock) {
  const double ov = overlap_of(s, it.iter);
  ImGui::BeginTooltip();
  ImGui::Text("iteration %d%s%s%s", it.iter, it.complete ? "" : " (", it.complete ? "" : unfinished_word(s), it.complete ? "" : ")");
  ImGui::TextDisabled("rank 0, %s clock", modeled_clock ? "modeled" : "wall");
  ImGui::Text("%s  from %s", time_text(it.e - it.b).c_str(), time_text(it.b).c_str());
  if (ov >= 0) ImGui::Text("overlap %.0f%%: share of all-reduce time hidden behind backward", 100 * ov);
  ImGui::EndTooltip();
}

// The header, on the parent window: the ruler with the cursor's time, and rank 0's iterations.
void draw_header(const Snapshot& s, const std::vector<IterExtent>& iters0, const TimelineCanvas& c, const TimeAxis& ax,
                 const Ticks& ticks, float ruler_h, float strip_h, bool modeled_clock) {
  const float fs = ImGui::GetFontSize(), header_h = ruler_h + strip_h;
  const ImVec2 hp = c.header_pos, mouse = ImGui::GetIO().MousePos;
  ImDrawList* hdl = ImGui::GetWindowDrawList();
  hdl->PushClipRect(ImVec2(ax.x0, hp.y), ImVec2(ax.x1, hp.y + header_h), true);
  const bool show_cursor = c.hovered();
  const std::string cursor_text = show_cursor ? fmt_time_at(ax.t(mouse.x), 1.0 / ax.px_per_unit) : std::string();
  const ImVec2 cursor_size = ImGui::CalcTextSize(cursor_text.c_str());
  const float cursor_x = cursor_chip_x(ax, mouse.x, cursor_size.x);
  draw_ruler(hdl, ax, ticks, hp.y, hp.y + ruler_h, fs,
             show_cursor ? ImVec2(cursor_x - 4, cursor_x + cursor_size.x + 6) : ImVec2(FLT_MAX, -FLT_MAX));
  const float sy0 = hp.y + ruler_h, sy1 = hp.y + header_h;
  const IterExtent* hovered_iter = draw_iteration_strip(hdl, s, iters0, ax, sy0, strip_h, c.header_hovered, modeled_clock);
  if (show_cursor) {
    vline(hdl, std::floor(mouse.x) + 0.5f, hp.y, sy1, IM_COL32(255, 255, 255, 120));
    draw_cursor_chip(hdl, cursor_text.c_str(), cursor_size, cursor_x, hp.y, 0.15f * fs);
  }
  hdl->PopClipRect();
  hdl->AddText(ImVec2(hp.x + 0.3f * fs, hp.y + 0.2f * fs), ImGui::GetColorU32(ImGuiCol_TextDisabled), modeled_clock ? "modeled" : "wall");
  hdl->AddText(ImVec2(hp.x + 0.3f * fs, sy0 + (strip_h - fs) * 0.5f + 1), ImGui::GetColorU32(ImGuiCol_TextDisabled), "rank 0");
  if (hovered_iter && !ImGui::IsMouseDragging(ImGuiMouseButton_Left, 1.0f)) iteration_tooltip(s, *hovered_iter, modeled_clock);
}

}  // namespace

void draw_timeline_view(const Snapshot& s, TimelineViewState& view, ViewContext& ctx) {
  draw_focus_line(s);
  const float fs = ImGui::GetFontSize();
  const EventClock clock{ctx.modeled_clock};
  if (view.modeled != ctx.modeled_clock) view.modeled = ctx.modeled_clock, view.follow = true;
  const int ranks = static_cast<int>(s.events.size());

  // Every rank's rows, brought up to date with what is new; then what "follow" shows: rank 0's
  // last two iterations, to the end of everything recorded.
  view.index.update(s.events, clock);
  const double t_max = view.index.t_max;
  if (!view.follow && t_max > -DBL_MAX && t_max < view.t0) view.follow = true;  // a new run restarted the clock
  if (view.follow) {
    view.index.follow_range(view.t0, view.t1);
    ctx.own_span = view.t1 - view.t0;  // A/B: both sides follow with the longer one's span
    if (ctx.shared_span > ctx.own_span) view.t1 = view.t0 + ctx.shared_span;
  } else {
    ctx.own_span = view.t1 - view.t0;
  }

  // A side of an A/B comparison has no toolbar: the clock is the toolbar's (M), a double-click follows
  // again, and side A's caption keys nothing the spans' labels do not say.
  if (ctx.compare_side == 0) draw_toolbar(view, ctx, s.config.precision == Precision::FP16, false, s.config.roof);

  const float ruler_h = 1.45f * fs, strip_h = 1.35f * fs, header_h = ruler_h + strip_h;
  const float natural = std::max(ranks, 1) * make_layout(fs, 1.0f).rank_h;
  const TimelineLayout L = make_layout(fs, std::clamp((ImGui::GetContentRegionAvail().y - header_h - 4) / natural, 1.0f, 1.6f));
  const TimelineCanvas c = begin_timeline_canvas({"##tl_header", "##tl_lanes", "##tl_canvas"}, header_h, L.label_w, L.rank_h, ranks);

  // Input: wheel zooms around the cursor's time, dragging pans (and scrolls the ranks).
  TimeAxis ax = c.axis(view.t0, view.t1, 1e-12);
  if (c.zoom_and_pan(ax, view.t0, view.t1, 1e-9, 1e4)) view.follow = false;
  if (c.double_clicked()) {
    view.follow = true;
    view.index.follow_range(view.t0, view.t1);
  }
  ax = c.axis(view.t0, view.t1, 1e-12);
  const Ticks ticks = make_ticks(ax, fs);

  Hover hover;
  draw_lanes(s, view, c, ax, ticks, L, clock, hover);
  if (c.canvas_hovered && !ImGui::IsMouseDragging(ImGuiMouseButton_Left, 1.0f)) lane_tooltip(s, hover, fs);
  ImGui::EndChild();
  draw_header(s, view.index.iterations0(), c, ax, ticks, ruler_h, strip_h, ctx.modeled_clock);
}

}  // namespace dtlab::app
