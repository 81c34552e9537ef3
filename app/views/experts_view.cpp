// The Experts view (--moe): for one rank (the stepper's focus, else the one chosen), each MoE block's
// router in its last forward: a bar per expert of the tokens that chose it, the part its capacity kept
// solid and the dropped part hatched red, the capacity drawn across, the rank holding each expert under
// --ep, the imbalance (the busiest expert's load over the mean) and the load-balancing loss, with
// their trend over the last forwards. Read while the run stands still (Session::read_experts).
#include <algorithm>
#include <cstdio>
#include <string>

#include "app/views/views.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

// A sparkline of `v` in [a, b] with its name and last value above it.
void sparkline(ImDrawList* dl, ImVec2 a, ImVec2 b, const std::vector<float>& v, const char* name, ImU32 col) {
  dl->AddRect(a, b, IM_COL32(255, 255, 255, 40));
  if (v.empty()) return;
  if (v.size() == 1) {  // one forward so far: its value, and a dot where the line will start
    char t[96];
    std::snprintf(t, sizeof t, "%s %.3g", name, v[0]);
    dl->AddText(ImVec2(a.x + 2, a.y + 1), kDim, fit_text(t, b.x - a.x - 4).c_str());
    dl->AddCircleFilled(ImVec2(a.x + 4, (a.y + b.y) * 0.5f), 3.0f, col);
    return;
  }
  const auto [lo_it, hi_it] = std::minmax_element(v.begin(), v.end());
  const float lo = *lo_it, hi = std::max(*hi_it, lo + 1e-6f);
  std::vector<ImVec2> pts;
  for (size_t i = 0; i < v.size(); i++)
    pts.emplace_back(a.x + (b.x - a.x) * static_cast<float>(i) / static_cast<float>(v.size() - 1),
                     b.y - 2 - (b.y - a.y - 4) * (v[i] - lo) / (hi - lo));
  dl->AddPolyline(pts.data(), static_cast<int>(pts.size()), col, 0, 2.0f);
  char t[96];
  std::snprintf(t, sizeof t, "%s %.3g .. %.3g", name, lo, hi);
  dl->AddText(ImVec2(a.x + 2, a.y + 1), kDim, fit_text(t, b.x - a.x - 4).c_str());
}

}  // namespace

void draw_experts_view(const Snapshot& s, ViewContext& ctx, ExpertsViewState& state) {
  const ExpertsView& x = s.experts;
  if (!x.moe) {
    ImGui::TextWrapped("This run has no mixture of experts: start a GPT with --moe experts=4,top_k=2 (add --strategy ddp "
                       "--ep 2 to spread each block's experts over ranks).");
    return;
  }
  if (!x.read || x.ranks.empty()) {
    ImGui::TextWrapped("The routing is read when the run stands still after a forward: pause it (Space) or step (C, I).");
    return;
  }
  const int world = static_cast<int>(x.ranks.size());
  int rank = s.stepper.focus_rank >= 0 && s.stepper.focus_rank < world ? s.stepper.focus_rank : std::clamp(state.rank, 0, world - 1);
  char head[256];
  std::snprintf(head, sizeof head, "%lld experts, top %lld, %s%s; at step %lld", static_cast<long long>(x.experts),
                static_cast<long long>(x.top_k), x.capacity_factor > 0 ? "capacity factor " : "dropless",
                x.capacity_factor > 0 ? (std::to_string(x.capacity_factor).substr(0, 4)).c_str() : "",
                static_cast<long long>(x.at_step));
  ImGui::TextWrapped("%s", head);
  // Whose tokens: the focus's (said, not a slider that would not move), else the slider's, labelled on
  // its left so the label stays on screen however narrow the window.
  const bool focused = s.stepper.focus_rank >= 0 && s.stepper.focus_rank < world;
  if (focused) {
    ImGui::TextWrapped("Tokens of rank %d (the stepper's focus).", rank);
  } else if (world > 1) {
    ImGui::AlignTextToFramePadding();
    ImGui::TextUnformatted("Tokens of");
    const float w = std::max(ImGui::GetFontSize() * 6, std::min(ImGui::GetContentRegionAvail().x, ImGui::GetFontSize() * 12));
    flow(w);
    ImGui::SetNextItemWidth(w);
    if (ImGui::SliderInt("##experts_rank", &rank, 0, world - 1, "rank %d")) state.rank = rank;
  }
  const auto& blocks = x.ranks[static_cast<size_t>(rank)];
  if (blocks.empty()) {
    ImGui::TextWrapped("Rank %d ran no MoE block's forward yet.", rank);
    return;
  }
  const float fs = ImGui::GetFontSize();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float block_h = std::max(fs * 7, avail.y / static_cast<float>(blocks.size()) - ImGui::GetStyle().ItemSpacing.y);
  const int64_t E = x.experts;
  for (const ExpertsBlockView& b : blocks) {
    const double mean = static_cast<double>(b.tokens * x.top_k) / static_cast<double>(E);
    const int64_t most = *std::max_element(b.routed.begin(), b.routed.end());
    char line[200];
    // (The capacity is named here, not beside its red line, which can run along the top of the bars.)
    std::snprintf(line, sizeof line, "block %d: imbalance %.2f (busiest / mean load), aux loss %.4g, dropped %lld of %lld%s", b.layer,
                  mean > 0 ? static_cast<double>(most) / mean : 0.0, b.aux_loss, static_cast<long long>(b.dropped),
                  static_cast<long long>(b.tokens * x.top_k),
                  b.capacity > 0 ? (", capacity " + std::to_string(b.capacity) + " (red line)").c_str() : "");
    const ImVec2 p0 = ImGui::GetCursorScreenPos();
    const float w = avail.x;
    ImGui::InvisibleButton(("##block" + std::to_string(b.layer)).c_str(), ImVec2(std::max(1.0f, w), block_h));
    ImDrawList* dl = ImGui::GetWindowDrawList();
    dl->AddText(p0, kText, fit_text(line, w).c_str());
    // Bars on the left two thirds, the trend on the right third.
    const float bars_w = w * (ctx.presentation ? 0.68f : 0.64f), top = p0.y + fs * 1.4f, bottom = p0.y + block_h - fs * 2.6f;
    const double scale = std::max<double>({static_cast<double>(most), static_cast<double>(b.capacity), mean, 1.0});
    auto y_of = [&](double v) { return bottom - static_cast<float>(v / scale) * (bottom - top); };
    const float slot = bars_w / static_cast<float>(E);
    int hovered = -1;
    for (int64_t e = 0; e < E; e++) {
      const float x0 = p0.x + slot * static_cast<float>(e) + slot * 0.15f, x1 = x0 + slot * 0.7f;
      const int64_t routed = b.routed[static_cast<size_t>(e)], kept = b.kept[static_cast<size_t>(e)];
      const ImU32 col = rank_color(x.owner(rank, e), world);
      dl->AddRectFilled(ImVec2(x0, y_of(static_cast<double>(kept))), ImVec2(x1, bottom), col);
      if (routed > kept) {
        const ImVec2 d0(x0, y_of(static_cast<double>(routed))), d1(x1, y_of(static_cast<double>(kept)));
        dl->AddRectFilled(d0, d1, IM_COL32(200, 60, 60, 90));
        draw_hatch(dl, d0, d1, IM_COL32(230, 80, 80, 255), 6);
      }
      centered_text(dl, ImVec2((x0 + x1) / 2, bottom + fs * 0.6f), kText, fit_text("e" + std::to_string(e), slot));
      if (ImGui::IsMouseHoveringRect(ImVec2(x0, top), ImVec2(x1, bottom))) hovered = static_cast<int>(e);
    }
    // The mean load (dotted) and the capacity (red), across the bars.
    dl->AddLine(ImVec2(p0.x, y_of(mean)), ImVec2(p0.x + bars_w, y_of(mean)), with_alpha(kDim, 0.6f), 1);
    if (b.capacity > 0) {
      const float yc = y_of(static_cast<double>(b.capacity));
      dl->AddLine(ImVec2(p0.x, yc), ImVec2(p0.x + bars_w, yc), IM_COL32(240, 90, 90, 255), 2);
    }
    // The rank holding each run of experts: "experts 2-3 on rank 1".
    const int64_t per = x.ep > 1 ? E / x.ep : E;
    for (int64_t e0 = 0; e0 < E; e0 += per) {
      const std::string t = "experts " + index_span(e0, e0 + per) + " on rank " + std::to_string(x.owner(rank, e0));
      centered_text(dl, ImVec2(p0.x + slot * (static_cast<float>(e0) + static_cast<float>(per) / 2), bottom + fs * 1.8f), kDim,
                    fit_text(t, slot * static_cast<float>(per) - 4));
    }
    const float sx = p0.x + bars_w + fs, sw = w - bars_w - fs, sh = (bottom - top) / 2 - fs * 0.3f;
    if (sw > fs * 4) {
      sparkline(dl, ImVec2(sx, top), ImVec2(sx + sw, top + sh), b.imbalance_history, "imbalance", IM_COL32(255, 190, 80, 255));
      sparkline(dl, ImVec2(sx, top + sh + fs * 0.6f), ImVec2(sx + sw, top + 2 * sh + fs * 0.6f), b.aux_history, "aux loss",
                IM_COL32(150, 200, 255, 255));
      dl->AddText(ImVec2(sx, bottom + fs * 0.3f), kDim,
                  fit_text("last " + std::to_string(b.aux_history.size()) + " forwards", sw).c_str());
    }
    if (hovered >= 0) {
      const size_t e = static_cast<size_t>(hovered);
      ImGui::SetTooltip("expert %d on rank %d: %lld tokens chose it, %lld kept, %lld dropped", hovered, x.owner(rank, hovered),
                        static_cast<long long>(b.routed[e]), static_cast<long long>(b.kept[e]),
                        static_cast<long long>(b.routed[e] - b.kept[e]));
    }
  }
}

}  // namespace dtlab::app
