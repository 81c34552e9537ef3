// FSDP's shard map: for every unit, its flat parameter split in chunks of ceil(N/W), and one row
// per rank showing what that rank holds right now: its own shard (solid), the chunks an all-gather
// brought from their owners (faint, while the unit is unsharded), nothing once it is resharded.
// While the shown collective is a unit's all-gather or reduce-scatter, the cells light up chunk by
// chunk from the live ring state (how many ranks' contributions each chunk holds), so a student
// sees the gradient shards being summed onto their owners. Everything comes from FsdpUnit events.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "app/views/views.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

const char* state_short(FsdpState s) {
  switch (s) {
    case FsdpState::Idle: return "idle";
    case FsdpState::Forward: return "forward";
    case FsdpState::PreBackward: return "pre-backward";
    case FsdpState::PostBackward: return "post-backward";
  }
  return "";
}

ImU32 state_color(FsdpState s) {
  switch (s) {
    case FsdpState::Idle: return IM_COL32(120, 124, 132, 255);
    case FsdpState::Forward: return IM_COL32(90, 170, 255, 255);
    case FsdpState::PreBackward: return IM_COL32(255, 170, 70, 255);
    case FsdpState::PostBackward: return IM_COL32(240, 110, 90, 255);
  }
  return IM_COL32_WHITE;
}

// Diagonal hatching over [a, b]: the zero padding at the end of the last chunks.
void hatch(ImDrawList* dl, ImVec2 a, ImVec2 b, ImU32 col) {
  const float step = 5.0f, h = b.y - a.y;
  dl->PushClipRect(a, b, true);
  for (float x = a.x - h; x < b.x; x += step) dl->AddLine(ImVec2(x, b.y), ImVec2(x + h, a.y), col, 1.0f);
  dl->PopClipRect();
}

struct ShardLayout {
  float label_w, bar_x, bar_w, row_h, state_w;
};

// How the shown collective touches this unit: its all-gather or its reduce-scatter, in flight or
// just finished, with per-rank per-chunk contribution counts.
enum class Live { None, Gather, Reduce };

Live live_of(const Snapshot& s, const UnitView& u) {
  const CollectiveView& cv = s.collective;
  if (!cv.valid || cv.cells.empty() || cv.chunks != u.shard_world) return Live::None;
  if (cv.seq == u.gather_seq && cv.op == CollectiveOp::AllGather) return Live::Gather;
  if (cv.seq == u.reduce_seq && cv.op == CollectiveOp::ReduceScatter) return Live::Reduce;
  return Live::None;
}

void draw_unit(const Snapshot& s, const UnitView& u, const ShardLayout& L, double time) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float fs = ImGui::GetFontSize();
  const int W = s.config.world, K = std::max(1, u.shard_world);
  const Live live = live_of(s, u);
  const bool live_now = live != Live::None && s.collective.in_flight;

  // ---- title: the unit, its parameters, the split
  std::string names;
  for (const std::string& n : u.names) names += (names.empty() ? "" : ", ") + n;
  // Its parts on one line when they fit, wrapping between them (and inside the long one) when not.
  ImGui::Text("unit %d", u.index);
  char split[256];
  std::snprintf(split, sizeof split, "%s  \xC2\xB7  %s elements -> %d chunks of %s", names.c_str(), with_commas(u.numel).c_str(), K,
                with_commas(u.chunk).c_str());
  ImGui::PushTextWrapPos(0.0f);
  flow(std::min(ImGui::CalcTextSize(split).x, ImGui::GetFontSize() * 12));
  ImGui::TextDisabled("%s", split);
  if (live != Live::None) {
    const CollectiveView& cv = s.collective;
    const CollectiveOp op = live == Live::Gather ? CollectiveOp::AllGather : CollectiveOp::ReduceScatter;
    char what[96];
    std::snprintf(what, sizeof what, "%s %s, step %d/%d", collective_traits(op).display_name, cv.in_flight ? "in flight" : "done",
                  cv.steps_done, cv.steps);
    flow(ImGui::CalcTextSize(what).x);
    ImGui::TextColored(live == Live::Gather ? ImVec4(0.45f, 0.75f, 1.0f, 1.0f) : ImVec4(1.0f, 0.65f, 0.3f, 1.0f), "%s", what);
  }
  ImGui::PopTextWrapPos();

  // ---- the flat parameter: owners' colors, parameter boundaries, padding
  const float seg_w = L.bar_w / static_cast<float>(K);
  const float padded = static_cast<float>(u.chunk) * static_cast<float>(K);
  auto x_of = [&](int64_t element) { return L.bar_x + L.bar_w * static_cast<float>(element) / std::max(1.0f, padded); };
  ImVec2 p = ImGui::GetCursorScreenPos();
  const float y0 = p.y, h = L.row_h * 0.8f;
  dl->AddText(ImVec2(p.x, y0), IM_COL32(170, 170, 178, 255), "flat param");
  for (int k = 0; k < K; k++) {
    const float a = L.bar_x + seg_w * static_cast<float>(k);
    dl->AddRectFilled(ImVec2(a + 1, y0), ImVec2(a + seg_w - 1, y0 + h), rank_color(k, W, 0.85f));
    char lab[32];
    std::snprintf(lab, sizeof lab, K < W ? "chunk %d" : "r%d", k);
    const ImVec4 clip(a + 2, y0, a + seg_w - 2, y0 + h);
    dl->AddText(ImGui::GetFont(), fs * 0.85f, ImVec2(a + 4, y0 + 0.05f * fs), ink_on(rank_color(k, W)), lab, nullptr, 0, &clip);
  }
  if (u.numel < static_cast<int64_t>(padded)) hatch(dl, ImVec2(x_of(u.numel), y0), ImVec2(L.bar_x + L.bar_w, y0 + h), IM_COL32(30, 30, 34, 200));
  for (size_t i = 0; i < u.offsets.size(); i++) {
    const float x = x_of(u.offsets[i]);
    if (i > 0) dl->AddLine(ImVec2(x, y0 - 2), ImVec2(x, y0 + h + 2), IM_COL32(255, 255, 255, 230), 2.0f);
  }
  ImGui::Dummy(ImVec2(L.label_w + L.bar_w, L.row_h));
  if (ImGui::IsItemHovered()) {
    const float mx = ImGui::GetIO().MousePos.x;
    const int64_t el = static_cast<int64_t>((mx - L.bar_x) / L.bar_w * padded);
    std::string what = el >= u.numel ? "zero padding (ceil(N/W) * W - N elements)" : "";
    for (size_t i = 0; i < u.offsets.size() && what.empty(); i++)
      if (el >= u.offsets[i] && el < u.offsets[i] + u.sizes[i])
        what = u.names[i] + " element " + std::to_string(el - u.offsets[i]);
    if (el >= 0 && el < static_cast<int64_t>(padded))
      ImGui::SetTooltip("flat element %lld: %s\nchunk %lld, owned by rank %lld%s", static_cast<long long>(el), what.c_str(),
                        static_cast<long long>(el / std::max<int64_t>(1, u.chunk)), static_cast<long long>(el / std::max<int64_t>(1, u.chunk)),
                        K < W ? " of each node" : "");
  }

  // ---- one row per rank: what it holds now
  const float pulse = 0.55f + 0.45f * static_cast<float>(std::sin(time * 6.0));
  for (int r = 0; r < W && r < static_cast<int>(u.state.size()); r++) {
    p = ImGui::GetCursorScreenPos();
    const float y = p.y;
    if (K < W && r % K == 0 && r > 0) dl->AddLine(ImVec2(L.bar_x, y - 1), ImVec2(L.bar_x + L.bar_w, y - 1), IM_COL32(200, 200, 210, 120));
    char lab[48];
    if (K < W) std::snprintf(lab, sizeof lab, "rank %d (node %d)", r, r / K);
    else std::snprintf(lab, sizeof lab, "rank %d", r);
    dl->AddText(ImVec2(p.x, y), rank_color(r, W), lab);
    const bool gathered = u.gathered[static_cast<size_t>(r)] != 0, gathering = u.gathering[static_cast<size_t>(r)] != 0;
    const bool reducing = u.reducing[static_cast<size_t>(r)] != 0;
    for (int k = 0; k < K; k++) {
      const float a = L.bar_x + seg_w * static_cast<float>(k);
      const ImVec2 c0(a + 1, y + 1), c1(a + seg_w - 1, y + h);
      const bool own = k == r % K;
      ImU32 fill = 0;
      if (own) fill = rank_color(k, W, 0.95f);
      else if (gathered) fill = rank_color(k, W, 0.40f);
      // A live collective on this unit: the ring's cells say what this rank holds of chunk k.
      if (live != Live::None && r < static_cast<int>(s.collective.cells.size())) {
        const int held = s.collective.cells[static_cast<size_t>(r)][static_cast<size_t>(k)];
        if (live == Live::Gather) fill = held > 0 ? rank_color(k, W, own ? 0.95f : 0.55f) : 0;
        else fill = contribution_color(held, s.collective.world);
      }
      dl->AddRect(c0, c1, IM_COL32(90, 92, 100, 255));
      if (fill) dl->AddRectFilled(c0, c1, fill);
      if (own) dl->AddRect(c0, c1, IM_COL32(255, 255, 255, 220), 0, 0, 2.0f);
      // Padding lies in the last chunks; the stored shard keeps it as zeros.
      const int64_t real = std::clamp<int64_t>(u.numel - static_cast<int64_t>(k) * u.chunk, 0, u.chunk);
      if (real < u.chunk && (own || gathered)) {
        const float px = a + seg_w * static_cast<float>(real) / static_cast<float>(std::max<int64_t>(1, u.chunk));
        hatch(dl, ImVec2(std::max(px, c0.x), c0.y), c1, IM_COL32(20, 20, 24, 170));
      }
    }
    const ImVec2 b0(L.bar_x, y), b1(L.bar_x + L.bar_w, y + h + 1);
    if (gathering && !live_now) dl->AddRect(b0, b1, with_alpha(IM_COL32(110, 190, 255, 255), pulse), 0, 0, 2.0f);
    if (reducing && !live_now) dl->AddRect(b0, b1, with_alpha(IM_COL32(255, 160, 60, 255), pulse), 0, 0, 2.0f);
    const FsdpState st = u.state[static_cast<size_t>(r)];
    dl->AddText(ImVec2(L.bar_x + L.bar_w + 0.6f * fs, y), state_color(st), state_short(st));
    ImGui::Dummy(ImVec2(L.label_w + L.bar_w + L.state_w, L.row_h));
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("rank %d, unit %d: %s\nholds its shard (chunk %d)%s%s%s", r, u.index, fsdp_state_name(st), r % K,
                        gathered ? ", and the full parameters (gathered)" : "", gathering ? "; all-gather under way" : "",
                        reducing ? "; gradient reduce-scatter under way" : "");
  }
}

void draw_legend(float fs, int W) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  bool first = true;
  auto swatch = [&](ImU32 col, bool outline, const char* text) {
    if (!first) flow(1.2f * fs + ImGui::CalcTextSize(text).x, 0.9f * fs);
    first = false;
    const ImVec2 p = ImGui::GetCursorScreenPos();
    dl->AddRectFilled(ImVec2(p.x, p.y + 0.15f * fs), ImVec2(p.x + 0.9f * fs, p.y + 0.95f * fs), col);
    if (outline) dl->AddRect(ImVec2(p.x, p.y + 0.15f * fs), ImVec2(p.x + 0.9f * fs, p.y + 0.95f * fs), IM_COL32_WHITE, 0, 0, 2.0f);
    ImGui::Dummy(ImVec2(fs, fs));
    ImGui::SameLine(0, 0.2f * fs);
    ImGui::TextDisabled("%s", text);
  };
  swatch(rank_color(0, W, 0.95f), true, "its own shard");
  swatch(rank_color(0, W, 0.40f), false, "gathered copy");
  swatch(contribution_color(1, 4), false, "partial sum");
  swatch(contribution_color(4, 4), false, "reduced");
  const char* lines = "white lines: parameter boundaries; hatched: zero padding";
  flow(ImGui::CalcTextSize(lines).x, 0.9f * fs);
  ImGui::PushTextWrapPos(0.0f);
  ImGui::TextDisabled("%s", lines);
  ImGui::PopTextWrapPos();
}

}  // namespace

void draw_shard_view(const Snapshot& s, ViewContext& ctx) {
  const float fs = ImGui::GetFontSize();
  if (s.config.strategy != Strategy::Fsdp) {
    ImGui::TextUnformatted("The shard map shows --strategy fsdp runs.");
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled("FSDP flattens each unit's parameters into one buffer, splits it in W chunks of ceil(N/W) and "
                        "keeps chunk r on rank r; an all-gather rebuilds a unit just before it computes.");
    ImGui::PopTextWrapPos();
    return;
  }
  if (s.units.empty()) {
    ImGui::TextDisabled("Waiting for FSDP to lay out its units...");
    return;
  }
  const RunConfigView& c = s.config;
  const int K = s.units.front().shard_world;
  ImGui::PushTextWrapPos(0.0f);
  if (c.sharding == Sharding::NoShard || c.sharding == Sharding::Zero1) {
    ImGui::TextWrapped("%s keeps the full parameters on every rank; only %s.", sharding_name(c.sharding),
                       c.sharding == Sharding::Zero1 ? "the optimizer state is split (each rank steps 1/W of the flat parameters)"
                                                     : "gradients are all-reduced, unit by unit");
  } else {
    ImGui::TextWrapped("%s over %d ranks%s: each unit's flat parameter is split in %d chunks; rank r keeps chunk r%s. "
                       "An all-gather rebuilds a unit before it computes%s; its gradient is reduce-scattered back to the owners.",
                       sharding_name(c.sharding), c.world, K < c.world ? (" in node groups of " + std::to_string(K)).c_str() : "",
                       K, K < c.world ? " of its node" : "",
                       c.sharding == Sharding::ShardGradOp ? " and stays until its backward" : ", then is freed");
  }
  ImGui::PopTextWrapPos();
  draw_legend(fs, c.world);
  ImGui::Separator();

  ImGui::BeginChild("##list_units", ImVec2(0, 0), false);  // one block per unit: a list that scrolls
  ShardLayout L;
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  L.label_w = ImGui::CalcTextSize(K < c.world ? "rank 00 (node 0)  " : "flat param  ").x;
  L.state_w = ImGui::CalcTextSize("post-backward ").x + 0.6f * fs;
  L.bar_x = origin.x + L.label_w;
  L.bar_w = std::max(4.0f * fs, ImGui::GetContentRegionAvail().x - L.label_w - L.state_w);
  L.row_h = fs * 1.15f;
  for (const UnitView& u : s.units) {
    if (u.state.empty()) continue;
    draw_unit(s, u, L, ctx.time);
    ImGui::Spacing();
  }
  ImGui::EndChild();
}

}  // namespace dtlab::app
