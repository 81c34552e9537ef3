// The Roofline view: every layer op and collective of the last finished iteration on one rank (the
// focus, else rank 0) as a dot at its arithmetic intensity (FLOP/byte, x) and achieved rate (FLOP/s,
// y, wall clock), both axes log, under the device's roof: the memory slope up to the ridge, then the
// compute ceiling (engine/trace/roofline.h). Dots are coloured by kind; a hover names the span with
// its FLOPs, bytes, time and share of the roof. Collectives that add nothing (all-gathers) have no
// FLOPs and so no place on a FLOP/s axis: a line under the plot gives their share of the bandwidth.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "app/views/views.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

struct Plot {
  ImVec2 a, b;              // the axes' box
  double x_lo, x_hi;        // log10 FLOP/byte
  double y_lo, y_hi;        // log10 FLOP/s
  float x(double v) const {
    const double t = (std::log10(std::max(v, 1e-30)) - x_lo) / (x_hi - x_lo);
    return a.x + static_cast<float>(std::clamp(t, 0.0, 1.0)) * (b.x - a.x);
  }
  float y(double v) const {
    const double t = (std::log10(std::max(v, 1e-30)) - y_lo) / (y_hi - y_lo);
    return b.y - static_cast<float>(std::clamp(t, 0.0, 1.0)) * (b.y - a.y);
  }
};

// A decade's label: "0.01", "1", "10 k", "100 G".
std::string decade_text(int d) {
  static const char* const prefixes[] = {"", " k", " M", " G", " T", " P", " E"};
  char t[24];
  if (d < 0) std::snprintf(t, sizeof t, "%.*f", -d, std::pow(10.0, d));
  else std::snprintf(t, sizeof t, "%d%s", d % 3 == 0 ? 1 : d % 3 == 1 ? 10 : 100, prefixes[std::min(d / 3, 6)]);
  return t;
}

// Decade ticks, labelled with SI prefixes; at most ~6 labels per axis.
void draw_axes(ImDrawList* dl, const Plot& P) {
  const ImU32 grid = IM_COL32(255, 255, 255, 26), ink = IM_COL32(205, 205, 210, 255);
  const float fs = ImGui::GetFontSize();
  const int xs = static_cast<int>(std::ceil((P.x_hi - P.x_lo) / 6.0)), ys = static_cast<int>(std::ceil((P.y_hi - P.y_lo) / 6.0));
  for (int d = static_cast<int>(std::ceil(P.x_lo)); d <= static_cast<int>(std::floor(P.x_hi)); d++) {
    const float x = P.x(std::pow(10.0, d));
    dl->AddLine(ImVec2(x, P.a.y), ImVec2(x, P.b.y), grid);
    if (d % std::max(1, xs) != 0) continue;
    const std::string t = decade_text(d);
    dl->AddText(ImVec2(x - ImGui::CalcTextSize(t.c_str()).x / 2, P.b.y + 2), ink, t.c_str());
  }
  for (int d = static_cast<int>(std::ceil(P.y_lo)); d <= static_cast<int>(std::floor(P.y_hi)); d++) {
    const float y = P.y(std::pow(10.0, d));
    dl->AddLine(ImVec2(P.a.x, y), ImVec2(P.b.x, y), grid);
    if (d % std::max(1, ys) != 0) continue;
    const std::string t = decade_text(d);
    dl->AddText(ImVec2(P.a.x - ImGui::CalcTextSize(t.c_str()).x - 4, y - fs / 2), ink, t.c_str());
  }
  dl->AddRect(P.a, P.b, IM_COL32(255, 255, 255, 70));
  dl->AddText(ImVec2(P.a.x, P.a.y - fs * 1.25f), ink, "achieved FLOP/s");
  const char* xl = "arithmetic intensity (FLOP/byte)";
  dl->AddText(ImVec2(P.b.x - ImGui::CalcTextSize(xl).x, P.b.y + fs * 1.2f), ink, xl);
}

// The roof: bandwidth x intensity up to the ridge, then the ceiling; each labelled above its line near
// the ridge, where the legend (bottom right) and the axes' labels are not.
void draw_roof(ImDrawList* dl, const Plot& P, const Roof& roof) {
  const ImU32 col = IM_COL32(255, 236, 150, 255);
  const double lo = std::pow(10.0, P.x_lo), hi = std::pow(10.0, P.x_hi), ridge = roof.ridge();
  const ImVec2 p0(P.x(lo), P.y(lo * roof.bytes_per_s)), p1(P.x(ridge), P.y(roof.flops_per_s)), p2(P.x(hi), P.y(roof.flops_per_s));
  dl->AddLine(p0, p1, col, 3.0f);
  dl->AddLine(p1, p2, col, 3.0f);
  const float fs = ImGui::GetFontSize();
  const std::string ceiling = "peak " + si_text(roof.flops_per_s, "FLOP/s");
  const float cw = ImGui::CalcTextSize(ceiling.c_str()).x;
  // Above its line, or under it where the plot's top leaves no room (a peak just under the axis's top
  // decade, as a loaded machine measured: 66.5 G under 100 G, cut by the plot's edge).
  auto above_or_under = [&](float line_y) { return line_y - fs * 1.25f >= P.a.y + 1 ? line_y - fs * 1.25f : line_y + fs * 0.3f; };
  dl->AddText(ImVec2(std::max(p1.x + fs * 0.5f, P.b.x - cw - fs * 0.4f), above_or_under(p1.y)), col, ceiling.c_str());
  const std::string slope = si_text(roof.bytes_per_s, "B/s");
  const float sw = ImGui::CalcTextSize(slope.c_str()).x, sx = p1.x - sw - fs * 1.5f;
  if (sx > p0.x + fs) {  // above the slope where the text ends (the line rises under it), short of the ridge
    const float t = (sx + sw - p0.x) / std::max(1.0f, p1.x - p0.x);
    const float line_y = p0.y + (p1.y - p0.y) * t;
    // (Under the slope, the text starts where the line is lower: its left end, further from the line.)
    dl->AddText(ImVec2(sx, line_y - fs * 1.3f >= P.a.y + 1 ? line_y - fs * 1.3f : p0.y + (p1.y - p0.y) * ((sx - p0.x) / std::max(1.0f, p1.x - p0.x)) + fs * 0.3f),
                col, slope.c_str());
  }
}

void point_tooltip(const RooflinePoint& p, const Roof& roof) {
  ImGui::BeginTooltip();
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(roofline_kind_color(p.kind)), "%s  (%s)", p.name.c_str(),
                     roofline_kind_name(p.kind));
  ImGui::Text("%s, %s in %s", si_text(p.flops, "FLOP").c_str(), si_text(p.bytes, "B").c_str(), time_text(p.seconds).c_str());
  ImGui::Text("intensity %.3g FLOP/byte: %s, %s", p.intensity(), si_text(p.flops_per_s(), "FLOP/s").c_str(),
              si_text(p.bytes_per_s(), "B/s").c_str());
  if (roof.valid()) {
    const double f = fraction_of_roof(p, roof);
    ImGui::Text("%.1f%% of the roof there (%s)", 100 * f,
                p.intensity() >= roof.ridge() ? "compute-bound: against the FLOP/s ceiling" : "memory-bound: against the bandwidth");
    if (f > 1) ImGui::TextDisabled("above the roof: its data came from cache, faster than the memory the slope measures");
  }
  ImGui::EndTooltip();
}

// Bottom right, where the kernels rarely are (high intensity, low rate): one row per kind present.
void draw_legend(ImDrawList* dl, const Plot& P, const std::vector<RooflinePoint>& pts) {
  const float fs = ImGui::GetFontSize();
  std::vector<std::pair<RooflineKind, std::string>> rows;
  float w = 0;
  for (RooflineKind k : {RooflineKind::Gemm, RooflineKind::Elementwise, RooflineKind::Optimizer, RooflineKind::Collective}) {
    int n = 0;
    for (const RooflinePoint& p : pts) n += p.kind == k && p.flops > 0;
    if (n == 0) continue;
    rows.push_back({k, std::string(roofline_kind_name(k)) + " (" + std::to_string(n) + ")"});
    w = std::max(w, ImGui::CalcTextSize(rows.back().second.c_str()).x);
  }
  ImVec2 at(P.b.x - w - fs * 1.6f, P.b.y - fs * (0.4f + 1.2f * static_cast<float>(rows.size())));
  for (const auto& [k, text] : rows) {
    dl->AddCircleFilled(ImVec2(at.x + fs * 0.4f, at.y + fs * 0.55f), fs * 0.35f, roofline_kind_color(k));
    dl->AddText(ImVec2(at.x + fs * 1.1f, at.y), IM_COL32(230, 230, 235, 255), text.c_str());
    at.y += fs * 1.2f;
  }
}

}  // namespace

void draw_roofline_view(const Snapshot& s, ViewContext&) {
  const int rank = s.stepper.focus_rank >= 0 && s.stepper.focus_rank < static_cast<int>(s.events.size()) ? s.stepper.focus_rank : 0;
  const Roof& roof = s.config.roof;
  ImGui::PushTextWrapPos(0.0f);
  if (roof.valid())
    ImGui::Text("%s: peak %s, memory %s, ridge at %.3g FLOP/byte", roof.device.c_str(), si_text(roof.flops_per_s, "FLOP/s").c_str(),
                si_text(roof.bytes_per_s, "B/s").c_str(), roof.ridge());
  else
    ImGui::Text("%s: %s", roof.device.empty() ? "this device" : roof.device.c_str(), roof.source.c_str());
  if (roof.valid()) ImGui::TextDisabled("(%s)", roof.source.c_str());
  const std::vector<Event> none;
  const std::vector<Event>& evs = s.events.empty() ? none : s.events[static_cast<size_t>(rank)];
  const int32_t it = last_finished_iteration(evs);
  if (it < 0) {
    ImGui::TextDisabled("No finished iteration on rank %d yet: step one (I) and its layers and collectives appear here.", rank);
    ImGui::PopTextWrapPos();
    return;
  }
  const std::vector<RooflinePoint> pts = roofline_points(evs, it);
  std::vector<const RooflinePoint*> plotted, bandwidth_only;
  for (const RooflinePoint& p : pts) (p.flops > 0 && p.bytes > 0 ? plotted : bandwidth_only).push_back(&p);
  ImGui::TextDisabled("rank %d, iteration %d: %zu spans (wall clock); hover a dot", rank, it, plotted.size());
  if (!bandwidth_only.empty() && roof.valid()) {
    double bytes = 0, secs = 0;
    for (const RooflinePoint* p : bandwidth_only) bytes += p->bytes, secs += p->seconds;
    ImGui::TextDisabled("%zu without FLOPs (copies, all-gathers): %s, %.0f%% of the memory slope", bandwidth_only.size(),
                        si_text(secs > 0 ? bytes / secs : 0, "B/s").c_str(), secs > 0 ? 100 * bytes / secs / roof.bytes_per_s : 0);
  }
  ImGui::PopTextWrapPos();

  // ---- the canvas (ImGui's demo recipe): the axes' box inside margins for the labels
  const float fs = ImGui::GetFontSize();
  const ImVec2 origin = ImGui::GetCursorScreenPos(), avail = ImGui::GetContentRegionAvail();
  ImGui::InvisibleButton("##roofline", ImVec2(std::max(avail.x, 50.0f), std::max(avail.y, 50.0f)));
  double xlo = 1e30, xhi = 1e-30, ylo = 1e30, yhi = 1e-30;
  for (const RooflinePoint* p : plotted) {
    xlo = std::min(xlo, p->intensity()), xhi = std::max(xhi, p->intensity());
    ylo = std::min(ylo, p->flops_per_s()), yhi = std::max(yhi, p->flops_per_s());
  }
  if (roof.valid()) xlo = std::min(xlo, roof.ridge() / 100), xhi = std::max(xhi, roof.ridge() * 10), yhi = std::max(yhi, roof.flops_per_s);
  if (plotted.empty() && !roof.valid()) return;
  Plot P{ImVec2(origin.x + fs * 3.2f, origin.y + fs * 1.5f), ImVec2(origin.x + avail.x - fs, origin.y + avail.y - fs * 2.5f),
         std::floor(std::log10(xlo)), std::ceil(std::log10(xhi)), std::floor(std::log10(std::min(ylo, yhi / 1e3))),
         std::ceil(std::log10(yhi) + 0.15)};
  if (P.b.x - P.a.x < 40 || P.b.y - P.a.y < 40) return;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  draw_axes(dl, P);
  dl->PushClipRect(P.a, P.b, true);
  if (roof.valid()) draw_roof(dl, P, roof);
  const float r = std::max(4.0f, fs * 0.38f);
  const ImVec2 m = ImGui::GetIO().MousePos;
  const RooflinePoint* hovered = nullptr;
  float best = r * r * 2.5f;
  for (const RooflinePoint* p : plotted) {
    const ImVec2 c(P.x(p->intensity()), P.y(p->flops_per_s()));
    dl->AddCircleFilled(c, r, roofline_kind_color(p->kind));
    dl->AddCircle(c, r, IM_COL32(20, 20, 24, 230), 0, 1.5f);
    const float d2 = (m.x - c.x) * (m.x - c.x) + (m.y - c.y) * (m.y - c.y);
    if (d2 < best) best = d2, hovered = p;
  }
  dl->PopClipRect();
  draw_legend(dl, P, pts);
  if (hovered && ImGui::IsItemHovered()) {
    dl->AddCircle(ImVec2(P.x(hovered->intensity()), P.y(hovered->flops_per_s())), r + 3, IM_COL32_WHITE, 0, 2.0f);
    point_tooltip(*hovered, roof);
  }
}

}  // namespace dtlab::app
