// Imported profiler traces (dtlab --open), drawn as the lab draws its own runs. The timeline: per
// rank a thin row of annotations (ProfilerStep#N), a compute lane, a comm lane and a copies lane on
// the aligned clock, the comm lane lit where communication ran under compute. The collectives
// panel: every collective matched across ranks, who came last and how late. The breakdown: each
// rank's time split as Holistic Trace Analysis splits it. Compare: the same model run in dtlab,
// modeled beside measured. Each panel draws a fully loaded trace, or says how the load stands.
#include <algorithm>
#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <imgui_internal.h>  // IsMouseDragPastThreshold: a click, not the end of a drag, selects

#include "app/views/timeline_canvas.h"
#include "app/views/views.h"
#include "engine/core/format.h"
#include "engine/trace/cost_model.h"

namespace dtlab::app {

namespace {

// ---- colors: the kinds of work take the palette's work_color(), as on the live timeline; these are
// the trace's own
constexpr ImU32 kMemcpy = IM_COL32(214, 172, 112, 255);
constexpr ImU32 kAnnotation = IM_COL32(150, 152, 164, 255);
constexpr ImU32 kIdle = IM_COL32(120, 122, 130, 255);
constexpr ImU32 kSelected = IM_COL32(255, 255, 255, 255);
constexpr ImU32 kSpanText = IM_COL32(16, 18, 22, 255);
const ImVec4 kRed(1.0f, 0.42f, 0.36f, 1.0f);
const ImVec4 kAmber(1.0f, 0.75f, 0.3f, 1.0f);

ImVec4 vec(ImU32 c) { return ImGui::ColorConvertU32ToFloat4(c); }
ImVec4 dim() { return ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled); }

ImU32 hue_color(ComputeHue h) {
  switch (h) {
    case ComputeHue::Backward: return work_color(Work::Backward);
    case ComputeHue::Optimizer: return work_color(Work::Optimizer);
    case ComputeHue::Loss: return work_color(Work::Loss);
    default: return work_color(Work::Forward);
  }
}

std::string us_text(double us) { return time_text(us * 1e-6); }
// A point on the aligned clock, in the unit of its size (or of `magnitude_us`, so a ruler's ticks
// share one), with the decimals `precision_us` resolves: at 110 ms, "110.234 ms" to the µs where
// time_text's "110 ms" would say nothing.
std::string at_text(double us, double precision_us, double magnitude_us = 0) {
  const double a = std::max(std::fabs(us), std::fabs(magnitude_us));
  const double scale = a < 1e3 ? 1 : a < 1e6 ? 1e-3 : 1e-6;
  const char* unit = a < 1e3 ? "\xC2\xB5s" : a < 1e6 ? "ms" : "s";
  const int dec = std::clamp(static_cast<int>(std::ceil(-std::log10(std::max(precision_us, 1e-6) * scale) - 1e-9)), 0, 6);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f %s", dec, us * scale, unit);
  return buf;
}
std::string gbs_text(double gbs) {
  char buf[32];
  if (gbs < 0) return "-";
  if (gbs >= 1) std::snprintf(buf, sizeof buf, "%.2f", gbs);
  else std::snprintf(buf, sizeof buf, "%.3g", gbs);
  return buf;
}
std::string bytes_text(int64_t b) { return b < 0 ? "-" : human_bytes(b); }

void vline(ImDrawList* dl, float x, float y0, float y1, ImU32 c, float w = 1.0f) { dl->AddLine(ImVec2(x, y0), ImVec2(x, y1), c, w); }

// ---- the load: a progress bar and Cancel, or the error; true once a whole trace is there
bool trace_ready(const TraceSnapshot& t, TraceUi& ui, bool full) {
  if (t.load == TaskState::Done && t.trace) return true;
  const float fs = ImGui::GetFontSize();
  if (t.load == TaskState::Running) {
    if (!full) {
      ImGui::TextColored(dim(), "Loading the traces... %.0f%%", 100 * t.fraction);
      return false;
    }
    ImGui::Text("Reading %d trace file%s (%s)", t.files, t.files == 1 ? "" : "s", human_bytes(t.bytes).c_str());
    char overlay[96];
    std::snprintf(overlay, sizeof overlay, "%s of %s read  \xC2\xB7  %.1f s", human_bytes(static_cast<int64_t>(t.fraction * static_cast<double>(t.bytes))).c_str(),
                  human_bytes(t.bytes).c_str(), t.elapsed_s);
    ImGui::ProgressBar(static_cast<float>(t.fraction), ImVec2(std::min(ImGui::GetContentRegionAvail().x, 40 * fs), 0), overlay);
    if (ImGui::Button("Cancel")) ui.cancel = true;
    ImGui::TextColored(dim(), "The views appear when every rank is read and aligned.");
    return false;
  }
  if (t.load == TaskState::Failed) {
    ImGui::PushTextWrapPos(0);
    ImGui::TextColored(kRed, "%s", full ? "The traces could not be opened:" : "No trace:");
    ImGui::PushStyleColor(ImGuiCol_Text, kRed);
    ImGui::TextWrapped("%s", t.error.c_str());
    ImGui::PopStyleColor();
    ImGui::PopTextWrapPos();
    if (full && ImGui::Button("Try again")) ui.reopen = true;
    return false;
  }
  if (t.load == TaskState::Cancelled) {
    ImGui::TextColored(dim(), "Loading cancelled.");
    if (full && ImGui::Button("Open again")) ui.reopen = true;
    return false;
  }
  ImGui::TextColored(dim(), "No trace open.");
  return false;
}

// Rows of one rank, from the top of its block, in font units stretched to fill the panel.
struct Lanes {
  float fs = 13, label_w = 100;
  float ann0 = 0, ann1 = 0, cmp0 = 0, cmp1 = 0, com0 = 0, com1 = 0, cpy0 = 0, cpy1 = 0, rank_h = 0;
  float strip = 0;  // the overlap strip at the comm lane's top
};

Lanes make_lanes(float fs, float stretch) {
  Lanes L;
  L.fs = fs;
  const float u = fs * stretch;
  L.label_w = ImGui::CalcTextSize("rank 00 compute").x + 1.2f * fs;
  L.ann0 = 0.05f * u, L.ann1 = 0.95f * u;
  L.cmp0 = 1.05f * u, L.cmp1 = 2.45f * u;
  L.com0 = 2.55f * u, L.com1 = 4.15f * u;
  L.cpy0 = 4.25f * u, L.cpy1 = 4.95f * u;
  L.strip = 0.22f * u;
  L.rank_h = 5.45f * u;
  return L;
}

std::pair<float, float> lane_band(const Lanes& L, TraceLane lane) {
  switch (lane) {
    case TraceLane::Annotation: return {L.ann0, L.ann1};
    case TraceLane::Compute: return {L.cmp0, L.cmp1};
    case TraceLane::Comm: return {L.com0 + L.strip + 1, L.com1};
    case TraceLane::Memcpy: return {L.cpy0, L.cpy1};
  }
  return {L.cmp0, L.cmp1};
}

// What the mouse is over, for the tooltip and a click.
struct Hover {
  enum Kind { None, Span, Merged, Overlap, Issue } kind = None;
  int rank = -1;
  int32_t span = -1;       // RankTrace::spans (Span, Merged: the first), or RankTrace::collectives (Issue)
  int count = 0;           // Merged
  double b = 0, e = 0;     // Merged, Overlap
};

struct Ctx {
  ImDrawList* dl;
  const TimeAxis& ax;
  const ImportedTrace& tr;
  const TraceIndex& ix;
  ImVec2 mouse;
  bool mouse_in;
  Hover& hover;
  int selected;
};

// The iteration a ProfilerStep span is: its place among the rank's steps in time order (the
// importer's numbering; torch 1.13's ProfilerStep#N lag and repeat), or -1.
int step_index(const RankTrace& rt, const TraceSpan& s) {
  auto it = std::lower_bound(rt.steps.begin(), rt.steps.end(), s.begin_us - 1e-3,
                             [](const RankTrace::Step& st, double t) { return st.begin_us < t; });
  return it != rt.steps.end() && std::fabs(it->begin_us - s.begin_us) <= 1e-3 ? static_cast<int>(it - rt.steps.begin()) : -1;
}

// The label a span shows where it fits: its name, and for communication the collective.
void span_label(const Ctx& c, const RankTrace& rt, const TraceSpan& s, float xa, float xb, float y0, float y1) {
  const float room = xb - xa - 6;
  const float size = std::min(ImGui::GetFontSize(), (y1 - y0) * 0.92f);
  if (room < size * 1.5f || size < 11) return;  // smaller text is noise, on a projector most of all
  std::string text = c.tr.name(s.name);
  if (s.collective >= 0 && static_cast<size_t>(s.collective) < rt.collectives.size()) {
    const RankCollective& rc = rt.collectives[static_cast<size_t>(s.collective)];
    const int k = c.ix.ranks[static_cast<size_t>(rt.rank)].collective_of[static_cast<size_t>(s.collective)];
    const int bucket = k >= 0 ? c.tr.collectives[static_cast<size_t>(k)].bucket : -1;
    text = rc.name + (k >= 0 ? " #" + std::to_string(k) : "") + (bucket >= 0 ? " b" + std::to_string(bucket) : "");
  } else if (text.rfind("ProfilerStep#", 0) == 0) {
    const int i = step_index(rt, s);
    text = i >= 0 ? "iteration " + std::to_string(i) : "step " + text.substr(13);
  }
  ImFont* font = ImGui::GetFont();
  // Cut at a character boundary (UTF-8) to fit, ending in ".." when cut: a binary search, so a long
  // kernel name costs a few measures a frame, not one per byte.
  const std::string shown = fit_text(text, room, size, "..");
  if (shown.size() < (shown.size() < text.size() ? 6u : 1u)) return;  // "ate.." says nothing
  const float w = font->CalcTextSizeA(size, FLT_MAX, 0, shown.c_str()).x;
  c.dl->AddText(font, size, ImVec2(std::max(xa + 3, (xa + xb - w) * 0.5f), y0 + (y1 - y0 - size) * 0.5f), kSpanText, shown.c_str());
}

ImU32 span_color(const ImportedTrace& tr, const TraceIndex& ix, const TraceSpan& s) {
  switch (s.cls) {
    case SpanClass::Compute: return hue_color(ix.hue[static_cast<size_t>(s.name)]);
    case SpanClass::Comm: return work_color(Work::Communication);
    case SpanClass::Memcpy: return kMemcpy;
    case SpanClass::Annotation: return tr.name(s.name).rfind("ProfilerStep#", 0) == 0 ? kAnnotation : darker(kAnnotation, 0.8f);
    default: return work_color(Work::Communication);
  }
}

// One row's spans in [y0, y1]. Spans under a pixel merge into one dimmed block, and a binary search
// skips the rest of their pixel column, so a zoomed-out 100 MB trace costs about a rectangle per pixel.
void draw_row(Ctx& c, const RankTrace& rt, const TraceRow& row, float y0, float y1) {
  const TimeAxis& ax = c.ax;
  const double t_lo = ax.t(ax.x0 - 2), t_hi = ax.t(ax.x1 + 2);
  const size_t first = static_cast<size_t>(std::partition_point(row.reach.begin(), row.reach.end(), [t_lo](double r) { return r < t_lo; }) -
                                           row.reach.begin());
  auto begin_of = [&](size_t i) { return rt.spans[static_cast<size_t>(row.spans[i])].begin_us; };
  const size_t n = row.spans.size();
  float run_x0 = 0, run_x1 = 0;
  int run_n = 0;
  size_t run_first = 0;
  double run_b = 0, run_e = 0;
  auto hit = [&](float a, float b) { return c.mouse_in && c.mouse.x >= a - 1 && c.mouse.x <= b + 1 && c.mouse.y >= y0 && c.mouse.y <= y1; };
  auto flush = [&] {
    if (!run_n) return;
    const TraceSpan& s = rt.spans[static_cast<size_t>(row.spans[run_first])];
    const ImU32 col = span_color(c.tr, c.ix, s);
    const ImVec2 a(run_x0, y0), b(std::max(run_x1, run_x0 + 1), y1);
    c.dl->AddRectFilled(a, b, with_alpha(col, run_n == 1 ? 1.0f : 0.55f));
    if (run_n > 1) c.dl->AddRectFilled(ImVec2(a.x, y1 - 2), b, col);
    if (hit(a.x, b.x)) {
      c.hover.kind = run_n == 1 ? Hover::Span : Hover::Merged;
      c.hover.rank = rt.rank, c.hover.span = row.spans[run_first], c.hover.count = run_n, c.hover.b = run_b, c.hover.e = run_e;
    }
    run_n = 0;
  };
  for (size_t i = first; i < n; i++) {
    const TraceSpan& s = rt.spans[static_cast<size_t>(row.spans[i])];
    if (s.begin_us > t_hi) break;
    const float xa = std::max(ax.x(s.begin_us), ax.x0 - 2), xb = std::min(ax.x(s.end_us), ax.x1 + 2);
    if (xb - xa < 1.0f) {
      if (run_n && xa <= run_x1 + 1.0f) {
        run_x1 = std::max(run_x1, xb), run_e = std::max(run_e, s.end_us), run_n++;
      } else {
        flush();
        run_x0 = xa, run_x1 = xb, run_b = s.begin_us, run_e = s.end_us, run_n = 1, run_first = i;
      }
      // The spans that begin before the next pixel column join the run without being looked at.
      const double t_next = ax.t(run_x1 + 1.0f);
      size_t j = i + 1;
      if (j < n && begin_of(j) <= t_next) {
        size_t lo = j, hi = n;
        while (lo < hi) {
          const size_t mid = (lo + hi) / 2;
          if (begin_of(mid) <= t_next) lo = mid + 1;
          else hi = mid;
        }
        if (lo - i > 2) {
          run_n += static_cast<int>(lo - 2 - i);
          run_e = std::max(run_e, row.reach[lo - 2]);
          run_x1 = std::max(run_x1, std::min(ax.x(run_e), ax.x1 + 2));
          i = lo - 2;
        }
      }
      continue;
    }
    flush();
    const ImU32 col = span_color(c.tr, c.ix, s);
    const bool border = xb - xa > 6.0f;
    if (border) c.dl->AddRectFilled(ImVec2(xa, y0), ImVec2(xb, y1), darker(col, 0.55f));
    c.dl->AddRectFilled(ImVec2(border ? xa + 1 : xa, border ? y0 + 1 : y0), ImVec2(border ? xb - 1 : xb, border ? y1 - 1 : y1), col);
    const int k = s.collective >= 0 && static_cast<size_t>(s.collective) < c.ix.ranks[static_cast<size_t>(rt.rank)].collective_of.size()
                      ? c.ix.ranks[static_cast<size_t>(rt.rank)].collective_of[static_cast<size_t>(s.collective)] : -1;
    if (k >= 0 && k == c.selected) c.dl->AddRect(ImVec2(xa - 1, y0 - 1), ImVec2(xb + 1, y1 + 1), kSelected, 0, 0, 2.5f);
    span_label(c, rt, s, std::max(xa, ax.x0), std::min(xb, ax.x1), y0, y1);
    if (hit(xa, xb)) c.hover.kind = Hover::Span, c.hover.rank = rt.rank, c.hover.span = row.spans[i];
  }
  flush();
}

void draw_rank(Ctx& c, int r, float y, const Lanes& L, const TraceCollective* sel) {
  const RankTrace& rt = c.tr.ranks[static_cast<size_t>(r)];
  const RankIndex& ri = c.ix.ranks[static_cast<size_t>(r)];
  ImDrawList* dl = c.dl;
  const TimeAxis& ax = c.ax;
  // Iterations: every other one faintly lit, a line where each begins (while they are apart).
  float last_line = -FLT_MAX;
  for (size_t i = 0; i < rt.steps.size(); i++) {
    const RankTrace::Step& st = rt.steps[i];
    const float a = std::max(ax.x(st.begin_us), ax.x0), b = std::min(ax.x(st.end_us), ax.x1);
    if (b <= a || b - a < 4) continue;
    if (i % 2) dl->AddRectFilled(ImVec2(a, y + L.cmp0), ImVec2(b, y + L.cpy1), IM_COL32(255, 255, 255, 12));
    if (ax.x(st.begin_us) >= ax.x0 && a - last_line >= 4) vline(dl, a, y, y + L.cpy1, IM_COL32(255, 255, 255, 60)), last_line = a;
  }
  // Lane floors, so an empty lane still reads as a lane.
  for (TraceLane lane : {TraceLane::Compute, TraceLane::Comm, TraceLane::Memcpy}) {
    const auto [a, b] = lane_band(L, lane);
    dl->AddRectFilled(ImVec2(ax.x0, y + a), ImVec2(ax.x1, y + b), IM_COL32(255, 255, 255, 7));
  }
  // Communication under compute: the comm lane lit, as the live timeline lights DDP's overlap.
  const double t_lo = ax.t(ax.x0 - 2), t_hi = ax.t(ax.x1 + 2);
  // Intervals closer than a pixel merge into one (a zoomed-out run holds thousands).
  auto ov = std::partition_point(ri.overlap.begin(), ri.overlap.end(), [t_lo](const auto& o) { return o.second < t_lo; });
  auto light = [&](float a, float b, double tb, double te) {
    b = std::max(b, a + 1);
    dl->AddRectFilled(ImVec2(a, y + L.com0 + L.strip), ImVec2(b, y + L.com1), with_alpha(work_color(Work::CommUnderCompute), 0.12f));
    dl->AddRectFilled(ImVec2(a, y + L.com0), ImVec2(b, y + L.com0 + L.strip), work_color(Work::CommUnderCompute));
    if (c.mouse_in && c.mouse.x >= a && c.mouse.x <= b && c.mouse.y >= y + L.com0 && c.mouse.y <= y + L.com0 + L.strip)
      c.hover.kind = Hover::Overlap, c.hover.rank = r, c.hover.b = tb, c.hover.e = te;
  };
  float run_a = 0, run_b = -1;
  double run_tb = 0, run_te = 0;
  for (; ov != ri.overlap.end() && ov->first <= t_hi; ++ov) {
    const float a = std::max(ax.x(ov->first), ax.x0), b = std::min(ax.x(ov->second), ax.x1);
    if (run_b >= run_a && a <= run_b + 1) {
      run_b = std::max(run_b, b), run_te = ov->second;
      continue;
    }
    if (run_b >= run_a) light(run_a, run_b, run_tb, run_te);
    run_a = a, run_b = b, run_tb = ov->first, run_te = ov->second;
  }
  if (run_b >= run_a) light(run_a, run_b, run_tb, run_te);
  // A lane with several threads (gloo's two workers, GPU streams) splits into a sub-row per thread,
  // so spans that ran at once do not hide each other.
  int threads[4] = {}, nth[4] = {};
  for (const TraceRow& row : ri.rows) threads[static_cast<int>(row.lane)]++;
  std::pair<float, float> comm_band_of_thread[64];  // the comm sub-row each thread's spans take (threads beyond: the lane)
  std::fill(std::begin(comm_band_of_thread), std::end(comm_band_of_thread), lane_band(L, TraceLane::Comm));
  for (const TraceRow& row : ri.rows) {
    const int lane = static_cast<int>(row.lane), k = threads[lane], i = nth[lane]++;
    const auto [a, b] = lane_band(L, row.lane);
    const float h = (b - a) / static_cast<float>(k);
    const float r0 = a + static_cast<float>(i) * h, r1 = a + static_cast<float>(i + 1) * h - (k > 1 ? 1.0f : 0.0f);
    if (row.lane == TraceLane::Comm && row.thread >= 0 && row.thread < 64) comm_band_of_thread[row.thread] = {r0, r1};
    draw_row(c, rt, row, y + r0, y + r1);
  }
  // The selected collective: how long this rank waited for the last one to arrive, hatched over its spans.
  if (sel && static_cast<size_t>(r) < sel->rank_index.size() && sel->rank_index[static_cast<size_t>(r)] >= 0) {
    const RankCollective& rc = rt.collectives[static_cast<size_t>(sel->rank_index[static_cast<size_t>(r)])];
    const double from = rc.issue_us >= 0 ? rc.issue_us : rc.begin_us;
    if (sel->last_arrival_us > from) {
      const float a = std::max(ax.x(from), ax.x0), b = std::min(ax.x(sel->last_arrival_us), ax.x1);
      if (b > a) {
        const int th = rc.span >= 0 ? rt.spans[static_cast<size_t>(rc.span)].thread : -1;
        const auto [g0, g1] = th >= 0 && th < 64 ? comm_band_of_thread[th] : lane_band(L, TraceLane::Comm);
        dl->AddRectFilled(ImVec2(a, y + g0), ImVec2(b, y + g1), IM_COL32(0, 0, 0, 90));
        draw_hatch(dl, ImVec2(a, y + g0), ImVec2(b, y + g1), IM_COL32(255, 255, 255, 170), 6.0f);
      }
    }
  }
  // Arrivals: where the rank issued each collective, a triangle over its comm lane; one per
  // triangle's width when they crowd (zoomed out), the selected one always.
  const float wi = 0.28f * L.fs, ty0 = y + L.com0, ty1 = y + L.com0 + 0.5f * L.fs;
  const ImDrawListFlags flags = dl->Flags;
  dl->Flags &= ~ImDrawListFlags_AntiAliasedFill;
  float last_x = -FLT_MAX;
  for (size_t k = 0; k < rt.collectives.size(); k++) {
    const RankCollective& rc = rt.collectives[k];
    if (rc.issue_us < t_lo || rc.issue_us > t_hi) continue;
    const float x = std::floor(ax.x(rc.issue_us)) + 0.5f;
    const bool selected = c.selected >= 0 && ri.collective_of[k] == c.selected;
    if (x - last_x < wi && !selected) continue;
    last_x = x;
    dl->AddTriangleFilled(ImVec2(x - wi, ty0), ImVec2(x + wi, ty0), ImVec2(x, ty1), selected ? kSelected : darker(work_color(Work::Communication), 0.8f));
    if (c.mouse_in && std::fabs(c.mouse.x - x) <= std::max(3.0f, wi) && c.mouse.y >= ty0 && c.mouse.y <= ty1)
      c.hover.kind = Hover::Issue, c.hover.rank = r, c.hover.span = static_cast<int32_t>(k);
  }
  dl->Flags = flags;
}

void draw_rank_label(const ImportedTrace& tr, const TraceCollective* sel, int r, float x, float y, const Lanes& L, ImDrawList* dl) {
  const float fs = L.fs;
  const int world = static_cast<int>(tr.ranks.size());
  draw_rank_label_bg(dl, r, world, x, y, y + L.cpy1, L.label_w, fs);
  const float tx = x + 0.6f * fs, sub = tx + ImGui::CalcTextSize("rank 00 ").x;
  char name[24];
  std::snprintf(name, sizeof name, "rank %d", tr.ranks[static_cast<size_t>(r)].rank);
  dl->AddText(ImVec2(tx, y + (L.cmp0 + L.cmp1 - fs) * 0.5f), rank_color(r, world), name);
  if (sel && sel->last_rank == r && tr.ranks.size() > 1)
    dl->AddText(ImVec2(tx, y + (L.com0 + L.com1 - fs) * 0.5f), ImGui::ColorConvertFloat4ToU32(kAmber), "last");
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text, 0.75f);
  const float small = 0.8f * fs;
  dl->AddText(ImGui::GetFont(), std::min(small, L.ann1 - L.ann0), ImVec2(sub, y + L.ann0), ImGui::GetColorU32(ImGuiCol_TextDisabled), "steps");
  dl->AddText(ImVec2(sub, y + (L.cmp0 + L.cmp1 - fs) * 0.5f), text, "compute");
  dl->AddText(ImVec2(sub, y + (L.com0 + L.com1 - fs) * 0.5f), text, "comm");
  dl->AddText(ImGui::GetFont(), std::min(fs, (L.cpy1 - L.cpy0) * 1.15f), ImVec2(sub, y + L.cpy0 - 0.1f * fs), text, "copies");
}

// Ticks 1-2-5 apart, about seven font sizes, labelled as time_text prints times.
void draw_ruler(ImDrawList* dl, const TimeAxis& ax, float y0, float y1, float fs) {
  dl->AddRectFilled(ImVec2(ax.x0, y0), ImVec2(ax.x1, y1), ImGui::GetColorU32(ImGuiCol_FrameBg));
  const double raw = 7.0 * fs / ax.px_per_unit;
  const double p10 = std::pow(10.0, std::floor(std::log10(raw))), m = raw / p10;
  const double step = (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p10;
  const ImU32 line = ImGui::GetColorU32(ImGuiCol_Text, 0.55f), text = ImGui::GetColorU32(ImGuiCol_Text, 0.9f);
  const int64_t k0 = static_cast<int64_t>(std::ceil(ax.t0 / step)), k1 = std::min(k0 + 400, static_cast<int64_t>(std::floor(ax.t1 / step)));
  for (int64_t k = k0; k <= k1; k++) {
    const float x = std::floor(ax.x(static_cast<double>(k) * step)) + 0.5f;
    vline(dl, x, y1 - 0.5f * fs, y1, line);
    dl->AddText(ImVec2(x + 3, y0 + 0.12f * fs), text,
                at_text(static_cast<double>(k) * step, step, std::max(std::fabs(ax.t0), std::fabs(ax.t1))).c_str());
  }
}

void tip_row(const char* key, const std::string& value) {
  ImGui::TableNextRow();
  ImGui::TableSetColumnIndex(0);
  ImGui::TextDisabled("%s", key);
  ImGui::TableSetColumnIndex(1);
  ImGui::TextUnformatted(value.c_str());
}

// The rows every tooltip and table of a matched collective shares.
void tip_collective(const ImportedTrace& tr, int k) {
  const TraceCollective& c = tr.collectives[static_cast<size_t>(k)];
  tip_row("collective", "#" + std::to_string(k) + "  " + c.name + (c.dtype.empty() ? "" : "  (" + c.dtype + ")"));
  tip_row("bytes", c.bytes >= 0 ? human_bytes(c.bytes) + "  (" + with_commas(c.bytes) + " B)" : "not recorded");
  tip_row("iteration", c.iteration >= 0 ? std::to_string(c.iteration) : "-");
  if (c.bucket >= 0) tip_row("DDP bucket", std::to_string(c.bucket));
  tip_row("busy", us_text(c.busy_us) + "  (every rank present)");
  if (c.algbw_gbs >= 0) tip_row("algbw / busbw", gbs_text(c.algbw_gbs) + " / " + gbs_text(c.busbw_gbs) + " GB/s");
  if (c.last_rank >= 0 && tr.ranks.size() > 1)
    tip_row("last to arrive", "rank " + std::to_string(c.last_rank) + ", " + us_text(c.last_arrival_us - c.first_arrival_us) + " after the first");
}

// The ImportedTrace::collectives index behind a hovered comm span or arrival mark, or -1.
int collective_at(const ImportedTrace& tr, const TraceIndex& ix, const Hover& h) {
  if (h.rank < 0) return -1;
  const RankIndex& ri = ix.ranks[static_cast<size_t>(h.rank)];
  int32_t local = -1;
  if (h.kind == Hover::Issue) local = h.span;
  else if (h.kind == Hover::Span) local = tr.ranks[static_cast<size_t>(h.rank)].spans[static_cast<size_t>(h.span)].collective;
  return local >= 0 && static_cast<size_t>(local) < ri.collective_of.size() ? ri.collective_of[static_cast<size_t>(local)] : -1;
}

void span_tooltip(const ImportedTrace& tr, const TraceIndex& ix, const Hover& h, int selected) {
  const RankTrace& rt = tr.ranks[static_cast<size_t>(h.rank)];
  ImGui::BeginTooltip();
  ImGui::PushTextWrapPos(ImGui::GetFontSize() * 36);
  if (h.kind == Hover::Issue) {
    const RankCollective& rc = rt.collectives[static_cast<size_t>(h.span)];
    ImGui::TextColored(vec(work_color(Work::Communication)), "rank %d issues %s at %s", rt.rank, rc.name.c_str(), at_text(rc.issue_us, 1).c_str());
  } else {
    if (h.kind == Hover::Merged) ImGui::Text("%d spans under one pixel (zoom in to tell them apart); the first:", h.count);
    const TraceSpan& s = rt.spans[static_cast<size_t>(h.span)];
    ImGui::TextColored(vec(span_color(tr, ix, s)), "%s", tr.name(s.name).c_str());
  }
  ImGui::PopTextWrapPos();
  const int k = collective_at(tr, ix, h);
  if (ImGui::BeginTable("##tip", 2, ImGuiTableFlags_SizingFixedFit)) {
    tip_row("rank", std::to_string(rt.rank));
    if (h.kind != Hover::Issue) {
      const TraceSpan& s = rt.spans[static_cast<size_t>(h.span)];
      tip_row("class", span_class_name(s.cls));
      if (const int i = s.cls == SpanClass::Annotation ? step_index(rt, s) : -1; i >= 0)
        tip_row("iteration", std::to_string(i) + "  (the rank's steps in time order, from 0)");
      tip_row("thread", static_cast<size_t>(s.thread) < rt.threads.size() ? rt.threads[static_cast<size_t>(s.thread)] : "-");
      const double b = h.kind == Hover::Merged ? h.b : s.begin_us, e = h.kind == Hover::Merged ? h.e : s.end_us;
      tip_row(h.kind == Hover::Merged ? "all of them" : "time", us_text(e - b) + "  (" + at_text(b, 1) + " to " + at_text(e, 1) + ")");
    }
    if (k >= 0) tip_collective(tr, k);
    ImGui::EndTable();
  }
  if (k >= 0) ImGui::TextDisabled(selected == k ? "selected" : "click: select it on every rank and in Collectives");
  ImGui::EndTooltip();
}

// A legend entry after the last item, or on a new line when the row is full.
void legend_item(ImU32 col, const char* text, int glyph = 0, bool first = false) {
  const float fs = ImGui::GetFontSize();
  if (!first) flow(1.15f * fs + ImGui::CalcTextSize(text).x, 0.9f * fs);
  const ImVec2 p = ImGui::GetCursorScreenPos();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 a(p.x, p.y + 0.2f * fs), b(p.x + 0.8f * fs, p.y + 0.9f * fs);
  if (glyph == 1) {  // the overlap strip
    dl->AddRectFilled(a, b, with_alpha(col, 0.3f));
    dl->AddRectFilled(a, ImVec2(b.x, a.y + 3), col);
  } else if (glyph == 2) {  // an arrival triangle
    dl->AddTriangleFilled(a, ImVec2(b.x, a.y), ImVec2(0.5f * (a.x + b.x), b.y), col);
  } else if (glyph == 3) {  // hatch
    dl->AddRectFilled(a, b, with_alpha(col, 0.15f));
    draw_hatch(dl, a, b, col, 4.0f);
  } else {
    dl->AddRectFilled(a, b, col);
  }
  ImGui::Dummy(ImVec2(fs, fs));
  ImGui::SameLine(0, 0.15f * fs);
  ImGui::TextUnformatted(text);
}

// The selected collective in view: centred, the range widened to hold it when too narrow.
void reveal_collective(const ImportedTrace& tr, TraceUi& ui) {
  const TraceCollective& c = tr.collectives[static_cast<size_t>(ui.selected)];
  const double b = std::min(c.first_arrival_us, c.end_us - c.busy_us), e = c.end_us;
  if (b >= ui.t0 && e <= ui.t1) return;
  const double span = std::max(ui.t1 - ui.t0, 3 * (e - b));
  ui.t0 = 0.5 * (b + e) - 0.5 * span, ui.t1 = ui.t0 + span, ui.fit = false;
}

// The whole run in view, with a 1% margin.
void fit_range(const ImportedTrace& tr, TraceUi& ui) {
  const double pad = 0.01 * std::max(tr.duration_us, 1.0);
  ui.t0 = -pad, ui.t1 = tr.duration_us + pad;
}

// Toolbar: fit, what is in view, the legend.
void draw_trace_toolbar(TraceUi& ui) {
  if (ImGui::Button("Fit")) ui.fit = true;
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("The whole run (or double-click the timeline)");
  ImGui::SameLine();
  ImGui::TextDisabled("%s in view", us_text(ui.t1 - ui.t0).c_str());
  ImGui::SameLine();
  ImGui::TextDisabled("(?)");
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Wheel: zoom around the cursor.  Drag: pan.  Double-click: the whole run.\n"
                      "Hover a span for its details; click a collective to select it on every rank.");
  legend_item(work_color(Work::Forward), "forward");
  legend_item(work_color(Work::Backward), "backward");
  legend_item(work_color(Work::Optimizer), "optimizer");
  legend_item(work_color(Work::Loss), "loss");
  legend_item(work_color(Work::Communication), "communication");
  legend_item(kMemcpy, "copies");
  legend_item(work_color(Work::CommUnderCompute), "comm under compute", 1);
  legend_item(work_color(Work::Communication), "issued", 2);
  legend_item(IM_COL32(255, 255, 255, 255), "waiting for the last rank", 3);
}

// The lanes: every rank on screen, the selected collective's last arrival and end across them,
// the cursor's line, then the label column over them. What the mouse is over lands in `hover`.
void draw_trace_lanes(const ImportedTrace& tr, const TraceIndex& ix, const TraceUi& ui, const TimelineCanvas& cv, const TimeAxis& ax,
                      const Lanes& L, Hover& hover) {
  const int ranks = static_cast<int>(tr.ranks.size());
  const TraceCollective* sel = ui.selected >= 0 ? &tr.collectives[static_cast<size_t>(ui.selected)] : nullptr;
  const ImVec2 cp = cv.lanes_pos, mouse = ImGui::GetIO().MousePos;
  const float total_h = cv.lanes_h;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  Ctx c{dl, ax, tr, ix, mouse, cv.canvas_hovered, hover, ui.selected};
  dl->PushClipRect(ImVec2(ax.x0, cv.window_y0), ImVec2(ax.x1, cv.window_y1), true);
  for (int r = 0; r < ranks; r++) {
    const float y = cp.y + static_cast<float>(r) * L.rank_h;
    if (cv.visible(y, L.rank_h)) draw_rank(c, r, y, L, sel);
  }
  if (sel) {  // where the last rank arrived and where the collective ended, across every rank
    for (double at : {sel->last_arrival_us, sel->end_us}) {
      const float x = std::floor(ax.x(at)) + 0.5f;
      for (float y = cp.y; y < cp.y + total_h; y += 8) vline(dl, x, y, std::min(y + 4, cp.y + total_h), IM_COL32(255, 255, 255, 150));
    }
  }
  if (cv.hovered()) vline(dl, mouse.x, cp.y, cp.y + total_h, IM_COL32(255, 255, 255, 90));
  dl->PopClipRect();
  for (int r = 0; r < ranks; r++) {
    const float y = cp.y + static_cast<float>(r) * L.rank_h;
    if (cv.visible(y, L.rank_h)) draw_rank_label(tr, sel, r, cp.x, y, L, dl);
  }
}

void overlap_tooltip(const ImportedTrace& tr, const Hover& hover) {
  ImGui::BeginTooltip();
  ImGui::TextColored(vec(work_color(Work::CommUnderCompute)), "communication under compute");
  ImGui::Text("rank %d: %s, from %s", tr.ranks[static_cast<size_t>(hover.rank)].rank, us_text(hover.e - hover.b).c_str(), at_text(hover.b, 1).c_str());
  ImGui::TextDisabled("Data moved while this rank computed: it cost no step time.");
  ImGui::EndTooltip();
}

// The ruler, with the cursor's time.
void draw_trace_header(const TimelineCanvas& cv, const TimeAxis& ax, float ruler_h) {
  const float fs = ImGui::GetFontSize();
  const ImVec2 hp = cv.header_pos, mouse = ImGui::GetIO().MousePos;
  ImDrawList* hdl = ImGui::GetWindowDrawList();
  hdl->PushClipRect(ImVec2(ax.x0, hp.y), ImVec2(ax.x1, hp.y + ruler_h), true);
  draw_ruler(hdl, ax, hp.y, hp.y + ruler_h, fs);
  if (cv.hovered()) {
    const std::string at = at_text(ax.t(mouse.x), 1 / ax.px_per_unit);
    const ImVec2 size = ImGui::CalcTextSize(at.c_str());
    draw_cursor_chip(hdl, at.c_str(), size, cursor_chip_x(ax, mouse.x, size.x), hp.y, 0.12f * fs);
  }
  hdl->PopClipRect();
  hdl->AddText(ImVec2(hp.x + 0.3f * fs, hp.y + 0.2f * fs), ImGui::GetColorU32(ImGuiCol_TextDisabled), "aligned clock");
}

}  // namespace

std::string trace_summary(const TraceSnapshot& t) {
  // The directory's name (a path ending in '/' names it in its parent), or the files' directory and their count.
  std::filesystem::path first = t.paths.empty() ? std::filesystem::path("traces") : std::filesystem::path(t.paths[0]);
  if (first.filename().empty()) first = first.parent_path();
  std::string where = t.paths.size() > 1 ? first.parent_path().filename().string() : first.filename().string();
  if (t.paths.size() > 1) where = (where.empty() ? std::string(".") : where) + " (" + std::to_string(t.paths.size()) + " files)";
  char buf[256];
  switch (t.load) {
    case TaskState::Running:
      std::snprintf(buf, sizeof buf, "%s: loading %.0f%%", where.c_str(), 100 * t.fraction);
      return buf;
    case TaskState::Failed: return where + ": failed to open";
    case TaskState::Cancelled: return where + ": loading cancelled";
    case TaskState::Idle: return where;
    case TaskState::Done: break;
  }
  const ImportedTrace& tr = t.trace->trace;
  std::snprintf(buf, sizeof buf, "%s: %zu rank%s, %s%s%s, %d iteration%s, %zu collective%s", where.c_str(), tr.ranks.size(),
                tr.ranks.size() == 1 ? "" : "s", trace_format_name(tr.format), tr.backend.empty() ? "" : ", ", tr.backend.c_str(),
                tr.iterations, tr.iterations == 1 ? "" : "s", tr.collectives.size(), tr.collectives.size() == 1 ? "" : "s");
  return buf;
}

std::string zoom_trace(const TraceSnapshot& t, TraceUi& ui, const std::string& what, int n) {
  if (!t.trace) return "zoom: no trace is loaded; wait trace first";
  const ImportedTrace& tr = t.trace->trace;
  if (what == "all") {
    ui.fit = true;
    return "";
  }
  if (what == "collective") {
    if (n < 0 || n >= static_cast<int>(tr.collectives.size()))
      return "zoom collective " + std::to_string(n) + ": the trace holds collectives 0 to " + std::to_string(static_cast<int>(tr.collectives.size()) - 1);
    const TraceCollective& c = tr.collectives[static_cast<size_t>(n)];
    const double b = std::min(c.first_arrival_us, c.end_us - c.busy_us), e = c.end_us, pad = std::max(0.25 * (e - b), 1.0);
    ui.t0 = b - pad, ui.t1 = e + pad, ui.fit = false;
    return "";
  }
  const std::vector<RankTrace::Step> none;
  const std::vector<RankTrace::Step>& steps = tr.ranks.empty() ? none : tr.ranks[0].steps;
  if (n < 0 || n >= static_cast<int>(steps.size()))
    return "zoom iteration " + std::to_string(n) + ": rank 0 recorded " +
           (steps.empty() ? std::string("no ProfilerStep") : "iterations 0 to " + std::to_string(steps.size() - 1));
  const RankTrace::Step& st = steps[static_cast<size_t>(n)];
  const double pad = 0.03 * (st.end_us - st.begin_us);
  ui.t0 = st.begin_us - pad, ui.t1 = st.end_us + pad, ui.fit = false;
  return "";
}

void draw_trace_timeline(const TraceSnapshot& t, TraceUi& ui, ViewContext& ctx) {
  (void)ctx;
  if (!trace_ready(t, ui, true)) return;
  const ImportedTrace& tr = t.trace->trace;
  const TraceIndex& ix = t.trace->index;
  const float fs = ImGui::GetFontSize();
  const int ranks = static_cast<int>(tr.ranks.size());
  if (ui.fit) fit_range(tr, ui);
  if (ui.selected >= static_cast<int>(tr.collectives.size())) ui.selected = -1;
  if (ui.reveal > 0 && ui.selected >= 0) reveal_collective(tr, ui);

  draw_trace_toolbar(ui);

  const float ruler_h = 1.45f * fs;
  const float natural = std::max(ranks, 1) * make_lanes(fs, 1.0f).rank_h;
  const Lanes L = make_lanes(fs, std::clamp((ImGui::GetContentRegionAvail().y - ruler_h - 4) / natural, 0.7f, 2.2f));
  const TimelineCanvas cv = begin_timeline_canvas({"##trace_ruler", "##trace_lanes", "##trace_canvas"}, ruler_h, L.label_w, L.rank_h, ranks);

  // Input: wheel zooms around the cursor, no closer than ten timestamp ticks across the panel, no
  // further than ten runs; dragging pans.
  TimeAxis ax = cv.axis(ui.t0, ui.t1, 1e-6);
  const double resolution = std::max(tr.resolution_us, 1e-3);
  if (cv.zoom_and_pan(ax, ui.t0, ui.t1, 10 * resolution, 10 * std::max(tr.duration_us, 1.0))) ui.fit = false;
  if (cv.double_clicked()) {
    ui.fit = true;
    fit_range(tr, ui);
  }
  ax = cv.axis(ui.t0, ui.t1, 1e-6);

  Hover hover;
  draw_trace_lanes(tr, ix, ui, cv, ax, L, hover);
  // A click on a collective (its span or its arrival mark) selects it everywhere; on nothing, clears.
  if (cv.clicked && !ImGui::IsMouseDragPastThreshold(ImGuiMouseButton_Left)) {
    ui.selected = collective_at(tr, ix, hover);
    ui.reveal = ui.selected >= 0 ? 2 : 0;  // the Collectives table scrolls to it
  }
  if (cv.canvas_hovered && !ImGui::IsMouseDragging(ImGuiMouseButton_Left, 1.0f)) {
    if (hover.kind == Hover::Overlap) overlap_tooltip(tr, hover);
    else if (hover.kind != Hover::None) span_tooltip(tr, ix, hover, ui.selected);
  }
  ImGui::EndChild();
  draw_trace_header(cv, ax, ruler_h);
}

// ---- the collectives: one row each, and for the selected one every rank's arrival
void draw_trace_collectives(const TraceSnapshot& t, TraceUi& ui, ViewContext& ctx) {
  (void)ctx;
  if (!trace_ready(t, ui, false)) return;
  const ImportedTrace& tr = t.trace->trace;
  const int n = static_cast<int>(tr.collectives.size()), world = static_cast<int>(tr.ranks.size());
  if (n == 0) {
    ImGui::TextColored(dim(), "No collective was matched across the ranks.");
    return;
  }
  if (ui.selected >= n) ui.selected = -1;
  const float fs = ImGui::GetFontSize(), row_h = ImGui::GetTextLineHeightWithSpacing();
  ImGui::PushTextWrapPos(0.0f);  // (a tile at 1280 x 720 cut it)
  ImGui::TextColored(dim(), "%d collective%s on %d rank%s. Click one to see it on every rank.", n, n == 1 ? "" : "s", world,
                     world == 1 ? "" : "s");
  ImGui::PopTextWrapPos();
  const float detail_h = ui.selected >= 0 ? (static_cast<float>(world) + 3.6f) * (row_h + 2) : 0;
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float table_h = std::max(avail.y - detail_h, 6 * row_h);
  const ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_ScrollY |
                                ImGuiTableFlags_ScrollX | ImGuiTableFlags_SizingFixedFit;
  if (ImGui::BeginTable("##trace_collectives", 10, flags, ImVec2(0, table_h))) {
    ImGui::TableSetupScrollFreeze(1, 1);
    for (const char* h : {"#", "iter", "bucket", "op", "bytes", "busy", "algbw GB/s", "busbw GB/s", "last", "late by"})
      ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    ImGuiListClipper clip;
    clip.Begin(n);
    if (ui.reveal > 0 && ui.selected >= 0) clip.ForceDisplayRangeByIndices(ui.selected, ui.selected + 1);
    while (clip.Step()) {
      for (int i = clip.DisplayStart; i < clip.DisplayEnd; i++) {
        const TraceCollective& c = tr.collectives[static_cast<size_t>(i)];
        ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(0);
        char id[24];
        std::snprintf(id, sizeof id, "%d", i);
        if (ImGui::Selectable(id, ui.selected == i, ImGuiSelectableFlags_SpanAllColumns)) {
          ui.selected = ui.selected == i ? -1 : i;
          ui.reveal = ui.selected >= 0 ? 2 : 0;
        }
        if (ui.reveal > 0 && ui.selected == i) ImGui::SetScrollHereY(0.4f);
        ImGui::TableSetColumnIndex(1);
        if (c.iteration >= 0) ImGui::Text("%d", c.iteration);
        else ImGui::TextColored(dim(), "-");
        ImGui::TableSetColumnIndex(2);
        if (c.bucket >= 0) ImGui::Text("%d", c.bucket);
        else ImGui::TextColored(dim(), "-");
        ImGui::TableSetColumnIndex(3);
        ImGui::TextUnformatted(c.name.c_str());
        ImGui::TableSetColumnIndex(4);
        ImGui::TextUnformatted(bytes_text(c.bytes).c_str());
        ImGui::TableSetColumnIndex(5);
        ImGui::TextUnformatted(us_text(c.busy_us).c_str());
        ImGui::TableSetColumnIndex(6);
        ImGui::TextUnformatted(gbs_text(c.algbw_gbs).c_str());
        ImGui::TableSetColumnIndex(7);
        ImGui::TextUnformatted(gbs_text(c.busbw_gbs).c_str());
        ImGui::TableSetColumnIndex(8);
        if (c.last_rank >= 0 && world > 1) ImGui::TextColored(vec(rank_color(c.last_rank, world)), "rank %d", c.last_rank);
        else ImGui::TextColored(dim(), "-");
        ImGui::TableSetColumnIndex(9);
        const double late = c.last_arrival_us - c.first_arrival_us;
        // Late by more than the data took to move: the wait, not the wire, set this collective's time.
        if (world > 1) ImGui::TextColored(late > c.busy_us ? kAmber : ImGui::GetStyleColorVec4(ImGuiCol_Text), "%s", us_text(late).c_str());
        else ImGui::TextColored(dim(), "-");
      }
    }
    ImGui::EndTable();
  }
  if (ui.selected < 0) return;
  const TraceCollective& c = tr.collectives[static_cast<size_t>(ui.selected)];
  ImGui::TextColored(vec(work_color(Work::Communication)), "#%d %s", ui.selected, c.name.c_str());
  if (c.bytes >= 0) {
    ImGui::SameLine(0, 0.6f * fs);
    ImGui::Text("%s %s", human_bytes(c.bytes).c_str(), c.dtype.c_str());
  }
  if (c.iteration >= 0) {
    ImGui::SameLine(0, 0.6f * fs);
    ImGui::TextColored(dim(), "iteration %d%s", c.iteration, c.bucket >= 0 ? (", bucket " + std::to_string(c.bucket)).c_str() : "");
  }
  if (!ImGui::BeginTable("##trace_arrivals", 6, ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_SizingFixedFit |
                                                  ImGuiTableFlags_ScrollY))
    return;
  ImGui::TableSetupScrollFreeze(0, 1);
  for (const char* h : {"rank", "issue", "begin", "end", "waited", "in comm"}) ImGui::TableSetupColumn(h);
  ImGui::TableHeadersRow();
  for (int r = 0; r < world; r++) {
    const int li = static_cast<size_t>(r) < c.rank_index.size() ? c.rank_index[static_cast<size_t>(r)] : -1;
    ImGui::TableNextRow();
    ImGui::TableSetColumnIndex(0);
    ImGui::TextColored(vec(rank_color(r, world)), "rank %d%s", tr.ranks[static_cast<size_t>(r)].rank, r == c.last_rank && world > 1 ? " (last)" : "");
    if (li < 0) {
      ImGui::TableSetColumnIndex(1);
      ImGui::TextColored(dim(), "not in this collective");
      continue;
    }
    const RankCollective& rc = tr.ranks[static_cast<size_t>(r)].collectives[static_cast<size_t>(li)];
    ImGui::TableSetColumnIndex(1);
    if (rc.issue_us >= 0) ImGui::TextUnformatted(at_text(rc.issue_us, 1).c_str());
    else ImGui::TextColored(dim(), "-");
    ImGui::TableSetColumnIndex(2);
    ImGui::TextUnformatted(at_text(rc.begin_us, 1).c_str());
    ImGui::TableSetColumnIndex(3);
    ImGui::TextUnformatted(at_text(rc.end_us, 1).c_str());
    ImGui::TableSetColumnIndex(4);
    const double waited = c.last_arrival_us - (rc.issue_us >= 0 ? rc.issue_us : rc.begin_us);
    if (r == c.last_rank) ImGui::TextColored(dim(), "-");
    else ImGui::TextUnformatted(us_text(std::max(waited, 0.0)).c_str());
    ImGui::TableSetColumnIndex(5);
    ImGui::TextUnformatted(us_text(rc.end_us - rc.begin_us).c_str());
  }
  ImGui::EndTable();
}

// ---- the breakdown, as Holistic Trace Analysis draws its temporal breakdown: per rank a bar
struct Part {
  const char* name;
  ImU32 color;
  double RankBreakdown::*us;
  bool hatch;
};
const Part kParts[] = {
    {"compute", work_color(Work::Forward), &RankBreakdown::compute_us, false},
    {"comm under compute", work_color(Work::CommUnderCompute), &RankBreakdown::overlapped_us, false},
    {"exposed comm", work_color(Work::Communication), &RankBreakdown::exposed_comm_us, false},
    {"copies", kMemcpy, &RankBreakdown::memcpy_us, false},
    {"idle", kIdle, &RankBreakdown::idle_us, true},
};

void draw_trace_breakdown(const TraceSnapshot& t, TraceUi& ui, ViewContext& ctx) {
  (void)ctx;
  if (!trace_ready(t, ui, false)) return;
  const ImportedTrace& tr = t.trace->trace;
  const int world = static_cast<int>(tr.ranks.size());
  const float fs = ImGui::GetFontSize();
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextColored(dim(), "Each rank's time from its first to its last profiled step:");
  ImGui::PopTextWrapPos();
  for (const Part& p : kParts) legend_item(p.color, p.name, p.hatch ? 3 : 0, &p == &kParts[0]);
  int most = 0;
  for (const RankBreakdown& b : tr.breakdown) most = std::max(most, b.straggled);
  const int total = static_cast<int>(tr.collectives.size());
  ImGui::BeginChild("##breakdown_ranks", ImVec2(0, 0), false);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  // Bars grow (to three lines) where the panel has room: shown alone, it reads from the back of a room.
  const float text_h = 3.4f * ImGui::GetTextLineHeightWithSpacing() + ImGui::GetStyle().ItemSpacing.y * 2;
  const float bar_h = std::clamp((ImGui::GetContentRegionAvail().y - 4 * fs) / static_cast<float>(std::max(world, 1)) - text_h, 1.5f * fs, 3.0f * fs);
  for (int r = 0; r < world && static_cast<size_t>(r) < tr.breakdown.size(); r++) {
    const RankBreakdown& b = tr.breakdown[static_cast<size_t>(r)];
    const RankAlignment& al = tr.ranks[static_cast<size_t>(r)].alignment;
    ImGui::Dummy(ImVec2(0, 0.3f * fs));
    ImGui::TextColored(vec(rank_color(r, world)), "rank %d", tr.ranks[static_cast<size_t>(r)].rank);
    ImGui::SameLine(0, 0.6f * fs);
    ImGui::Text("%s profiled", us_text(b.wall_us).c_str());
    if (world > 1) {
      char text[96];
      std::snprintf(text, sizeof text, "last to arrive at %d of %d collectives", b.straggled, total);
      flow(ImGui::CalcTextSize(text).x, 0.6f * fs);
      const bool worst = b.straggled > 0 && b.straggled == most;
      ImGui::TextColored(worst ? kAmber : dim(), "%s", text);
    }
    // The bar: one segment per part, its share written in it where it fits.
    const ImVec2 p = ImGui::GetCursorScreenPos();
    const float w = std::max(ImGui::GetContentRegionAvail().x, 4 * fs), h = bar_h;
    ImGui::PushID(r);
    ImGui::InvisibleButton("##bar", ImVec2(w, h));
    ImGui::PopID();
    const bool hovered = ImGui::IsItemHovered();
    double done = 0;
    for (size_t i = 0; i < std::size(kParts); i++) {
      const Part& part = kParts[i];
      const double us = b.*part.us, share = b.wall_us > 0 ? us / b.wall_us : 0;
      const float x0 = p.x + static_cast<float>(done) * w;
      done += share;
      const float x1 = i + 1 == std::size(kParts) ? p.x + w : p.x + static_cast<float>(std::min(done, 1.0)) * w;
      if (x1 - x0 < 0.5f) continue;
      if (part.hatch) {
        dl->AddRectFilled(ImVec2(x0, p.y), ImVec2(x1, p.y + h), with_alpha(part.color, 0.25f));
        draw_hatch(dl, ImVec2(x0, p.y), ImVec2(x1, p.y + h), part.color, 6.0f);
      } else {
        dl->AddRectFilled(ImVec2(x0, p.y), ImVec2(x1, p.y + h), part.color);
      }
      char named[64], pct[16];
      std::snprintf(named, sizeof named, "%s %.0f%%", part.name, 100 * share);
      std::snprintf(pct, sizeof pct, "%.0f%%", 100 * share);
      for (const char* label : {named, pct}) {
        const float tw = ImGui::CalcTextSize(label).x;
        if (x1 - x0 <= tw + 0.5f * fs) continue;
        dl->AddText(ImVec2(0.5f * (x0 + x1 - tw), p.y + 0.5f * (h - fs)), part.hatch ? ImGui::GetColorU32(ImGuiCol_Text) : ink_on(part.color), label);
        break;
      }
      if (hovered && ImGui::GetIO().MousePos.x >= x0 && ImGui::GetIO().MousePos.x < x1)
        ImGui::SetTooltip("rank %d, %s: %s (%.1f%% of %s)", tr.ranks[static_cast<size_t>(r)].rank, part.name, us_text(us).c_str(),
                          100 * share, us_text(b.wall_us).c_str());
    }
    dl->AddRect(p, ImVec2(p.x + w, p.y + h), IM_COL32(255, 255, 255, 60));
    // The times, then how this rank's clock was put on the others'.
    ImVec4 soft = ImGui::GetStyleColorVec4(ImGuiCol_Text);
    soft.w *= 0.78f;
    for (const Part& part : kParts) {
      const std::string item = us_text(b.*part.us) + " " + part.name;
      if (&part != &kParts[0]) {
        ImGui::SameLine(0, 0);
        ImGui::TextColored(soft, "  \xC2\xB7  ");
        flow(ImGui::CalcTextSize(item.c_str()).x, 0);
      }
      ImGui::TextColored(soft, "%s", item.c_str());
    }
    ImGui::PushTextWrapPos(0);
    if (al.anchors > 0 && al.offset_us == 0 && al.offset_min_us == 0 && al.offset_max_us == 0)
      ImGui::TextColored(dim(), "clock: the reference the other ranks are aligned to (%d anchors)", al.anchors);
    else if (al.anchors > 0)
      ImGui::TextColored(dim(), "clock %s%s \xC2\xB1 %s over %d anchors, residual %s", al.offset_us >= 0 ? "+" : "\xE2\x88\x92",
                         us_text(std::fabs(al.offset_us)).c_str(), us_text(0.5 * (al.offset_max_us - al.offset_min_us)).c_str(), al.anchors,
                         us_text(al.residual_max_us).c_str());
    else
      ImGui::TextColored(dim(), "clock as recorded (no anchor to align on)");
    ImGui::PopTextWrapPos();
  }
  ImGui::Spacing();
  ImGui::Separator();
  ImGui::PushTextWrapPos(0);
  for (const std::string& w : tr.warnings) ImGui::TextColored(kAmber, "%s", w.c_str());
  ImGui::TextColored(dim(), "%s, %s; %d files (%s), %s events, read in %.1f s; timestamps every %s", trace_format_name(tr.format),
                     tr.backend.empty() ? "backend not recorded" : tr.backend.c_str(), static_cast<int>(t.trace->files.files.size()),
                     human_bytes(t.trace->files.bytes).c_str(), with_commas(tr.events).c_str(), t.trace->load_s, us_text(tr.resolution_us).c_str());
  ImGui::PopTextWrapPos();
  ImGui::EndChild();
}

// ---- the same model in dtlab, modeled beside measured
void draw_trace_compare(const TraceSnapshot& t, TraceUi& ui, ViewContext& ctx) {
  (void)ctx;
  if (!trace_ready(t, ui, false)) return;
  const ImportedTrace& tr = t.trace->trace;
  const float fs = ImGui::GetFontSize();
  const bool running = t.compare == TaskState::Running;
  ImGui::BeginDisabled(running);
  std::vector<std::string> profiles;
  for (const HardwareProfile& p : builtin_profiles()) profiles.push_back(p.name);
  profiles.push_back("this");
  profiles.push_back("ideal");
  ImGui::SetNextItemWidth(6 * fs);
  if (ImGui::BeginCombo("##profile", ui.profile.c_str())) {
    for (const std::string& p : profiles)
      if (ImGui::Selectable(p.c_str(), p == ui.profile)) ui.profile = p;
    ImGui::EndCombo();
  }
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("The hardware profile dtlab's cost model charges the all-reduces on");
  char* model = ui.model_text;
  if (!ImGui::IsAnyItemActive() || std::string(model).empty()) std::snprintf(model, sizeof ui.model_text, "%s", ui.model.c_str());
  const float button_w = ImGui::CalcTextSize("Compare").x + 2 * ImGui::GetStyle().FramePadding.x + ImGui::GetStyle().ItemSpacing.x;
  flow(6 * fs + button_w);  // the model and the button beside the profile where they fit, else below it
  ImGui::SetNextItemWidth(std::max(6 * fs, ImGui::GetContentRegionAvail().x - button_w));
  if (ImGui::InputTextWithHint("##model", "model, e.g. mlp:2,512,512,3", model, sizeof ui.model_text)) ui.model = model;
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("The traced model as dtlab builds it (--trace-model, or dtlab.json's \"model\")");
  ImGui::SameLine();
  ImGui::BeginDisabled(ui.model.empty());
  if (ImGui::Button("Compare")) ui.compare = true;
  ImGui::EndDisabled();
  ImGui::EndDisabled();
  ImGui::PushTextWrapPos(0);
  if (running) {
    const TraceCompareOptions& o = t.compare_options;
    ImGui::Text("dtlab trains %s with DDP on %zu ranks, modeled on %s... %.1f s", o.model.c_str(), tr.ranks.size(), o.profile.c_str(),
                t.compare_elapsed_s);
  } else if (t.compare == TaskState::Failed) {
    ImGui::TextColored(kRed, "%s", t.compare_error.c_str());
  }
  if (!t.comparison) {
    if (!running && t.compare != TaskState::Failed) {
      ImGui::TextColored(dim(), "dtlab trains the same model with DDP on %zu rank%s for a few iterations and models each bucket's "
                                "all-reduce on the hardware profile, beside the one the trace measured.", tr.ranks.size(),
                         tr.ranks.size() == 1 ? "" : "s");
      if (ui.model.empty()) ImGui::TextColored(kAmber, "Give the traced model: --trace-model SPEC, dtlab.json's \"model\", or type it above.");
    }
    ImGui::PopTextWrapPos();
    return;
  }
  const TraceComparison& cmp = *t.comparison;
  ImGui::TextColored(vec(work_color(Work::CommUnderCompute)), "%s", cmp.summary.c_str());
  ImGui::TextColored(dim(), "%s on %d ranks, profile %s", cmp.model.c_str(), cmp.world, cmp.profile.c_str());
  if (!cmp.sizes_agree)
    ImGui::TextColored(kAmber, "The trace's all-reduce sizes differ from dtlab's buckets: is the model (or the bucket cap) the traced one?");
  for (const std::string& b : cmp.dtlab_buckets) ImGui::TextColored(dim(), "dtlab %s", b.c_str());
  ImGui::PopTextWrapPos();
  const ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_ScrollY | ImGuiTableFlags_ScrollX |
                                ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("##compare", 8, flags)) return;
  ImGui::TableSetupScrollFreeze(1, 1);
  for (const char* h : {"#", "iter", "bucket", "trace bytes", "dtlab bytes", "measured", "modeled", "ratio"})
    ImGui::TableSetupColumn(h);
  ImGui::TableHeadersRow();
  if (ImGui::TableGetColumnFlags(7) & ImGuiTableColumnFlags_IsHovered) ImGui::SetTooltip("measured / modeled");
  for (const CompareRow& row : cmp.rows) {
    ImGui::TableNextRow();
    ImGui::TableSetColumnIndex(0);
    char id[24];
    std::snprintf(id, sizeof id, "%d##cmp", row.collective);
    if (ImGui::Selectable(id, ui.selected == row.collective && row.collective >= 0, ImGuiSelectableFlags_SpanAllColumns) && row.collective >= 0)
      ui.selected = row.collective, ui.reveal = 2;
    ImGui::TableSetColumnIndex(1);
    ImGui::Text("%d", row.iteration);
    ImGui::TableSetColumnIndex(2);
    if (row.bucket >= 0) ImGui::Text("%d", row.bucket);
    else ImGui::TextColored(dim(), "-");
    ImGui::TableSetColumnIndex(3);
    ImGui::TextUnformatted(bytes_text(row.trace_bytes).c_str());
    ImGui::TableSetColumnIndex(4);
    const bool differs = row.trace_bytes >= 0 && row.dtlab_bytes >= 0 && row.trace_bytes != row.dtlab_bytes;
    ImGui::TextColored(differs ? kAmber : ImGui::GetStyleColorVec4(ImGuiCol_Text), "%s", bytes_text(row.dtlab_bytes).c_str());
    ImGui::TableSetColumnIndex(5);
    ImGui::TextUnformatted(us_text(row.measured_us).c_str());
    ImGui::TableSetColumnIndex(6);
    if (row.modeled_us >= 0) ImGui::TextUnformatted(us_text(row.modeled_us).c_str());
    else ImGui::TextColored(dim(), "-");
    ImGui::TableSetColumnIndex(7);
    if (row.ratio >= 0) ImGui::Text("%.2fx", row.ratio);
    else ImGui::TextColored(dim(), "-");
  }
  ImGui::EndTable();
}

}  // namespace dtlab::app
