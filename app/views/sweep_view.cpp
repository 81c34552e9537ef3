// The busbw plot: for the run's hardware profile and world, the tuning model's all-reduce bus
// bandwidth against message size (log axes, 8 B to 1 GiB) for every algorithm the profile offers,
// each at its best protocol, with the sizes where the fastest algorithm changes marked, and this
// run's all-reduces as dots at their sizes (their busbw on the modeled clock, from the events).
// `dtlab-cli bench collectives --sweep` prints the same curves as tables (engine/trace/tuning.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "app/views/views.h"
#include "engine/core/check.h"
#include "engine/trace/tuning.h"

namespace dtlab::app {

namespace {

constexpr int kMinLog2 = 3, kMaxLog2 = 30;  // 8 B .. 1 GiB
constexpr int kPerOctave = 4;               // curve samples per doubling

struct SweepCurve {
  Algorithm algo;
  std::vector<Prediction> points;  // at each sample size, the best protocol
};

struct Plot {
  ImVec2 a, b;  // the axes' box
  double y_lo, y_hi;  // log10 of GB/s
  float x(double bytes) const {
    const double t = (std::log2(std::max(bytes, 1.0)) - kMinLog2) / (kMaxLog2 - kMinLog2);
    return a.x + static_cast<float>(t) * (b.x - a.x);
  }
  float y(double gbs) const {
    const double t = (std::log10(std::max(gbs, 1e-9)) - y_lo) / (y_hi - y_lo);
    return b.y - static_cast<float>(std::clamp(t, 0.0, 1.0)) * (b.y - a.y);
  }
};

double sample_bytes(int i) { return std::exp2(kMinLog2 + static_cast<double>(i) / kPerOctave); }

std::vector<SweepCurve> curves_for(const HardwareProfile& p, int n) {
  std::vector<SweepCurve> out;
  const int samples = (kMaxLog2 - kMinLog2) * kPerOctave + 1;
  for (Algorithm a : kAlgorithms) {
    if (!select(p, n, CollectiveOp::AllReduce, 1, a).available) continue;
    SweepCurve c{a, {}};
    for (int i = 0; i < samples; i++) c.points.push_back(select(p, n, CollectiveOp::AllReduce, sample_bytes(i), a));
    out.push_back(std::move(c));
  }
  return out;
}

// The sizes (powers of two, as the CLI's sweep) where the fastest algorithm changes.
std::vector<std::pair<double, std::string>> crossovers(const std::vector<SweepCurve>& curves) {
  std::vector<std::pair<double, std::string>> out;
  int prev = -1;
  for (int i = 0; i < static_cast<int>(curves.empty() ? 0 : curves[0].points.size()); i += kPerOctave) {
    int best = 0;
    for (int k = 1; k < static_cast<int>(curves.size()); k++)
      if (curves[k].points[i].seconds < curves[best].points[i].seconds) best = k;
    if (prev >= 0 && best != prev)
      out.push_back({sample_bytes(i), std::string(algorithm_name(curves[prev].algo)) + " -> " + algorithm_name(curves[best].algo)});
    prev = best;
  }
  return out;
}

void draw_axes(ImDrawList* dl, const Plot& P) {
  const ImU32 grid = IM_COL32(255, 255, 255, 28), ink = IM_COL32(200, 200, 205, 255);
  const float fs = ImGui::GetFontSize();
  for (int l = kMinLog2 + 1; l <= kMaxLog2; l += 4) {  // 16 B, 256 B, 4 KiB, ...
    const float x = P.x(std::exp2(l));
    dl->AddLine(ImVec2(x, P.a.y), ImVec2(x, P.b.y), grid);
    const std::string t = format_bytes(std::exp2(l));
    dl->AddText(ImVec2(x - ImGui::CalcTextSize(t.c_str()).x / 2, P.b.y + 2), ink, t.c_str());
  }
  for (int d = static_cast<int>(std::ceil(P.y_lo)); d <= static_cast<int>(std::floor(P.y_hi)); d++) {
    const float y = P.y(std::pow(10.0, d));
    dl->AddLine(ImVec2(P.a.x, y), ImVec2(P.b.x, y), grid);
    char t[32];
    if (d >= 0) std::snprintf(t, sizeof t, "%.0f", std::pow(10.0, d));
    else std::snprintf(t, sizeof t, "%.*f", -d, std::pow(10.0, d));
    dl->AddText(ImVec2(P.a.x - ImGui::CalcTextSize(t).x - 4, y - fs / 2), ink, t);
  }
  dl->AddRect(P.a, P.b, IM_COL32(255, 255, 255, 70));
  dl->AddText(ImVec2(P.a.x - fs * 2.5f, P.a.y - fs * 1.3f), ink, "busbw (GB/s)");
  dl->AddText(ImVec2(P.b.x - ImGui::CalcTextSize("message size").x, P.b.y + fs * 1.2f), ink, "message size");
}

// This run's all-reduces over the world on rank 0 (a process group's runs on fewer ranks): their payload
// and busbw on the modeled clock.
void draw_run_dots(ImDrawList* dl, const Snapshot& s, const Plot& P) {
  if (s.events.empty()) return;
  for (const Event& e : s.events[0]) {
    if (e.kind != EventKind::Collective || e.coll.op != CollectiveOp::AllReduce || e.coll.bytes <= 0 || e.coll.group != 0) continue;
    const double dt = e.model_end - e.model_begin;
    if (!(dt > 0)) continue;
    const double busbw =
        static_cast<double>(e.coll.bytes) / dt / 1e9 * bus_bandwidth_factor(CollectiveOp::AllReduce, s.config.world, e.coll.algo);
    const ImVec2 c(P.x(static_cast<double>(e.coll.bytes)), P.y(busbw));
    dl->AddCircleFilled(c, 4.5f, algorithm_color(e.coll.algo));
    dl->AddCircle(c, 4.5f, IM_COL32(255, 255, 255, 220), 0, 1.2f);
  }
}

// Under the mouse: every curve's busbw and protocol at that size.
void hover_tooltip(const std::vector<SweepCurve>& curves, const Plot& P) {
  const ImVec2 m = ImGui::GetIO().MousePos;
  if (m.x < P.a.x || m.x > P.b.x || m.y < P.a.y || m.y > P.b.y || curves.empty()) return;
  const double t = (m.x - P.a.x) / (P.b.x - P.a.x);
  const int i = std::clamp(static_cast<int>(std::lround(t * (kMaxLog2 - kMinLog2) * kPerOctave)), 0,
                           static_cast<int>(curves[0].points.size()) - 1);
  ImGui::GetWindowDrawList()->AddLine(ImVec2(P.x(sample_bytes(i)), P.a.y), ImVec2(P.x(sample_bytes(i)), P.b.y),
                                      IM_COL32(255, 255, 255, 90));
  ImGui::BeginTooltip();
  ImGui::Text("%s", format_bytes(sample_bytes(i)).c_str());
  for (const SweepCurve& c : curves) {
    const Prediction& p = c.points[static_cast<size_t>(i)];
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(algorithm_color(c.algo)), "%-12s %-6s %9.3f GB/s  %s",
                       algorithm_name(c.algo), protocol_name(p.proto), p.busbw / 1e9, time_text(p.seconds).c_str());
  }
  ImGui::EndTooltip();
}

void draw_legend(ImDrawList* dl, const std::vector<SweepCurve>& curves, const Plot& P) {
  const float fs = ImGui::GetFontSize();
  ImVec2 at(P.a.x + fs * 0.5f, P.a.y + fs * 0.4f);
  for (const SweepCurve& c : curves) {
    dl->AddLine(ImVec2(at.x, at.y + fs / 2), ImVec2(at.x + fs * 1.4f, at.y + fs / 2), algorithm_color(c.algo), 3.0f);
    dl->AddText(ImVec2(at.x + fs * 1.8f, at.y), IM_COL32(230, 230, 235, 255), algorithm_display_name(c.algo));
    at.y += fs * 1.2f;
  }
}

}  // namespace

void draw_sweep_view(const Snapshot& s, ViewContext&) {
  const int n = s.config.world;
  HardwareProfile profile;
  try {
    profile = find_profile(s.config.profile.empty() ? "nvlink8" : s.config.profile);
  } catch (const Error& e) {
    ImGui::TextWrapped("%s", e.what());
    return;
  }
  if (n <= 1) {
    ImGui::TextDisabled("One rank: nothing to communicate. Run with --world 2 or more to see the algorithms' bus bandwidth.");
    return;
  }
  const int nodes = (n + profile.gpus_per_node - 1) / profile.gpus_per_node;
  ImGui::PushTextWrapPos(0.0f);  // a narrow window (presentation's type) wraps the header
  ImGui::Text("all-reduce busbw on %s, %d ranks over %d %s", profile.name.c_str(), n, nodes, nodes == 1 ? "node" : "nodes");
  const char* how = "(the tuning model, each algorithm at its best protocol; dots: this run's all-reduces, modeled clock)";
  flow(ImGui::CalcTextSize(how).x);
  ImGui::TextDisabled("%s", how);
  const std::vector<SweepCurve> curves = curves_for(profile, n);
  const auto marks = crossovers(curves);
  std::string xs;
  for (const auto& [bytes, what] : marks) xs += (xs.empty() ? "" : "; ") + what + " at " + format_bytes(bytes);
  ImGui::TextDisabled("crossovers: %s", xs.empty() ? "none (one algorithm is fastest at every size)" : xs.c_str());
  ImGui::PopTextWrapPos();

  // ---- the canvas (ImGui's demo recipe): the axes' box inside margins for the labels
  const float fs = ImGui::GetFontSize();
  const ImVec2 origin = ImGui::GetCursorScreenPos(), avail = ImGui::GetContentRegionAvail();
  ImGui::InvisibleButton("##sweep", ImVec2(std::max(avail.x, 50.0f), std::max(avail.y, 50.0f)));
  double hi = 1e-3, lo = 1e30;
  for (const SweepCurve& c : curves)
    for (const Prediction& p : c.points) hi = std::max(hi, p.busbw / 1e9), lo = std::min(lo, p.busbw / 1e9);
  Plot P{ImVec2(origin.x + fs * 4.5f, origin.y + fs * 1.6f), ImVec2(origin.x + avail.x - fs, origin.y + avail.y - fs * 2.6f),
         std::floor(std::log10(std::max(lo, 1e-6))), std::ceil(std::log10(hi) + 0.05)};
  if (P.b.x - P.a.x < 40 || P.b.y - P.a.y < 40) return;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  draw_axes(dl, P);
  dl->PushClipRect(P.a, P.b, true);
  // Labels that would run into the previous one step up a line, so close crossovers stay readable.
  float row_end[8] = {};
  for (const auto& [bytes, what] : marks) {
    const float x = P.x(bytes);
    for (float y = P.a.y; y < P.b.y; y += 8) dl->AddLine(ImVec2(x, y), ImVec2(x, std::min(y + 4, P.b.y)), IM_COL32(255, 230, 120, 200));
    const std::string label = what + " at " + format_bytes(bytes);
    int row = 0;
    while (row < 7 && row_end[row] > x) row++;
    row_end[row] = x + 3 + ImGui::CalcTextSize(label.c_str()).x + fs * 0.5f;
    dl->AddText(ImVec2(x + 3, P.b.y - fs * 1.3f * static_cast<float>(row + 1)), IM_COL32(255, 230, 120, 255), label.c_str());
  }
  for (const SweepCurve& c : curves) {
    std::vector<ImVec2> line;
    for (size_t i = 0; i < c.points.size(); i++) line.push_back(ImVec2(P.x(sample_bytes(static_cast<int>(i))), P.y(c.points[i].busbw / 1e9)));
    dl->AddPolyline(line.data(), static_cast<int>(line.size()), algorithm_color(c.algo), 0, 2.5f);
  }
  draw_run_dots(dl, s, P);
  dl->PopClipRect();
  draw_legend(dl, curves, P);
  if (ImGui::IsItemHovered()) hover_tooltip(curves, P);
}

}  // namespace dtlab::app
