// FSDP's shard map: for every unit, its flat parameter split in chunks of ceil(N/W), and one row
// per rank showing what that rank holds right now: its own shard (solid), the chunks an all-gather
// brought from their owners (faint, while the unit is unsharded), nothing once it is resharded.
// While the shown collective is a unit's all-gather or reduce-scatter, the cells light up chunk by
// chunk from the live ring state (how many ranks' contributions each chunk holds), so a student
// sees the gradient shards being summed onto their owners. Everything comes from FsdpUnit events.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <string>

#include "app/views/views.h"
#include "engine/core/format.h"
#include "engine/core/half.h"
#include "engine/parallel/fsdp.h"

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
  bool compact = false;  // FSDP2: the placement column in short words (a narrow window)
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

// A rank row's label ("rank 2 (node 1)" under HYBRID_SHARD, "rank 5 (node 1, TP 1)" beside --tp,
// "rank 3 (EP rank 1)" for an expert unit, whose experts are that EP rank's), and a line above each
// node's first rank. A node is K data-parallel ranks, each with its TP ranks: K x tp consecutive ranks.
void draw_rank_label(const ShardLayout& L, ImVec2 p, int r, const UnitView& u, const Snapshot& s) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const int W = s.config.world, T = std::max(1, s.mesh.shape.tp), D = std::max(1, W / T), K = std::max(1, u.shard_world);
  const bool hybrid = !u.experts && K < D;
  if (hybrid && r % (K * T) == 0 && r > 0)
    dl->AddLine(ImVec2(L.bar_x, p.y - 1), ImVec2(L.bar_x + L.bar_w, p.y - 1), IM_COL32(200, 200, 210, 120));
  char lab[64];
  if (u.experts) std::snprintf(lab, sizeof lab, "rank %d (EP rank %d)", r, r % std::max(1, u.owner_stride));
  else if (hybrid && T > 1) std::snprintf(lab, sizeof lab, "rank %d (node %d, TP %d)", r, r / (K * T), r % T);
  else if (hybrid) std::snprintf(lab, sizeof lab, "rank %d (node %d)", r, r / K);
  else if (T > 1) std::snprintf(lab, sizeof lab, "rank %d (TP %d)", r, r % T);
  else std::snprintf(lab, sizeof lab, "rank %d", r);
  dl->AddText(p, rank_color(r, W), lab);
}

// A unit's split, and the shown collective when it is this unit's all-gather or reduce-scatter.
void draw_unit_title(const Snapshot& s, const char* split, Live live) {
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
  char split[1024];  // a GPT block names a dozen parameters
  std::snprintf(split, sizeof split, "%s  \xC2\xB7  %s elements -> %d chunks of %s", names.c_str(), with_commas(u.numel).c_str(), K,
                with_commas(u.chunk).c_str());
  draw_unit_title(s, split, live);

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
    draw_rank_label(L, p, r, u, s);
    const bool gathered = u.gathered[static_cast<size_t>(r)] != 0, gathering = u.gathering[static_cast<size_t>(r)] != 0;
    const bool reducing = u.reducing[static_cast<size_t>(r)] != 0;
    for (int k = 0; k < K; k++) {
      const float a = L.bar_x + seg_w * static_cast<float>(k);
      const ImVec2 c0(a + 1, y + 1), c1(a + seg_w - 1, y + h);
      const bool own = k == u.owned_chunk(r);
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
      ImGui::SetTooltip("rank %d, unit %d: %s\nholds its shard (chunk %d)%s%s%s", r, u.index, fsdp_state_name(st), u.owned_chunk(r),
                        gathered ? ", and the full parameters (gathered)" : "", gathering ? "; all-gather under way" : "",
                        reducing ? "; gradient reduce-scatter under way" : "");
  }
}

// ---- NO_SHARD and ZeRO-1: the unit whole on every rank; ZeRO-1 marks the part of it each rank steps
// (its slice of the whole flat parameter vector, which need not follow the units' edges).
void draw_unit_replicated(const Snapshot& s, const UnitView& u, const ShardLayout& L, double time) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float fs = ImGui::GetFontSize();
  const int W = s.config.world;
  const bool zero1 = s.config.sharding == Sharding::Zero1;
  std::string names;
  for (const std::string& n : u.names) names += (names.empty() ? "" : ", ") + n;
  ImGui::Text("unit %d", u.index);
  char split[1024];  // a GPT block names a dozen parameters
  std::snprintf(split, sizeof split, "%s  \xC2\xB7  %s elements, whole on every rank%s", names.c_str(), with_commas(u.numel).c_str(),
                zero1 ? "; each rank steps its slice" : "");
  draw_unit_title(s, split, Live::None);
  auto x_of = [&](int64_t element) { return L.bar_x + L.bar_w * static_cast<float>(element) / std::max<float>(1.0f, static_cast<float>(u.numel)); };
  // ---- the flat parameter: under ZeRO-1 each stretch in the colour of the rank that steps it
  ImVec2 p = ImGui::GetCursorScreenPos();
  const float y0 = p.y, h = L.row_h * 0.8f;
  dl->AddText(ImVec2(p.x, y0), IM_COL32(170, 170, 178, 255), "flat param");
  dl->AddRectFilled(ImVec2(L.bar_x + 1, y0), ImVec2(L.bar_x + L.bar_w - 1, y0 + h), IM_COL32(120, 122, 132, 255));
  if (zero1)
    for (int r = 0; r < W && r < static_cast<int>(u.steps.size()); r++) {
      const auto [a, b] = u.steps[static_cast<size_t>(r)];
      if (a >= b) continue;  // (the ranks sharing a chunk, an expert group's, paint the same stretch)
      dl->AddRectFilled(ImVec2(x_of(a) + 1, y0), ImVec2(x_of(b) - 1, y0 + h), rank_color(u.owned_chunk(r), W, 0.85f));
    }
  for (size_t i = 1; i < u.offsets.size(); i++) {
    const float x = x_of(u.offsets[i]);
    dl->AddLine(ImVec2(x, y0 - 2), ImVec2(x, y0 + h + 2), IM_COL32(255, 255, 255, 230), 2.0f);
  }
  ImGui::Dummy(ImVec2(L.label_w + L.bar_w, L.row_h));
  if (ImGui::IsItemHovered()) {
    const int64_t el = static_cast<int64_t>((ImGui::GetIO().MousePos.x - L.bar_x) / L.bar_w * static_cast<float>(u.numel));
    std::string what, who;
    for (size_t i = 0; i < u.offsets.size() && what.empty(); i++)
      if (el >= u.offsets[i] && el < u.offsets[i] + u.sizes[i]) what = u.names[i] + " element " + std::to_string(el - u.offsets[i]);
    for (int r = 0; r < W && r < static_cast<int>(u.steps.size()); r++)
      if (el >= u.steps[static_cast<size_t>(r)].first && el < u.steps[static_cast<size_t>(r)].second)
        who += (who.empty() ? "" : ", ") + std::to_string(r);
    if (el >= 0 && el < u.numel)
      ImGui::SetTooltip("flat element %lld: %s\n%s", static_cast<long long>(el), what.c_str(),
                        zero1 ? ("stepped by rank " + who + " (the optimizer state for it lives there)").c_str()
                              : "every rank steps it (NO_SHARD: the optimizer state is whole on each)");
  }
  // ---- one row per rank: the full parameters, the part it steps outlined
  const float pulse = 0.55f + 0.45f * static_cast<float>(std::sin(time * 6.0));
  for (int r = 0; r < W && r < static_cast<int>(u.state.size()); r++) {
    p = ImGui::GetCursorScreenPos();
    const float y = p.y;
    draw_rank_label(L, p, r, u, s);
    const size_t ri = static_cast<size_t>(r);
    const ImVec2 b0(L.bar_x + 1, y + 1), b1(L.bar_x + L.bar_w - 1, y + h);
    dl->AddRectFilled(b0, b1, rank_color(r, W, 0.40f));
    const auto [a, b] = ri < u.steps.size() ? u.steps[ri] : std::pair<int64_t, int64_t>{0, 0};
    if (a < b) {
      const ImVec2 c0(x_of(a) + 1, y + 1), c1(x_of(b) - 1, y + h);
      dl->AddRectFilled(c0, c1, rank_color(r, W, 0.95f));
      dl->AddRect(c0, c1, IM_COL32(255, 255, 255, 220), 0, 0, 2.0f);
    }
    if (u.reducing[ri]) dl->AddRect(ImVec2(L.bar_x, y), ImVec2(L.bar_x + L.bar_w, y + h + 1), with_alpha(IM_COL32(255, 160, 60, 255), pulse), 0, 0, 2.0f);
    const FsdpState st = u.state[ri];
    dl->AddText(ImVec2(L.bar_x + L.bar_w + 0.6f * fs, y), state_color(st), state_short(st));
    ImGui::Dummy(ImVec2(L.label_w + L.bar_w + L.state_w, L.row_h));
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("rank %d, unit %d: %s\nholds the full parameters; %s%s", r, u.index, fsdp_state_name(st),
                        !zero1 ? "steps all of them"
                        : a < b ? ("steps elements " + with_commas(a) + " to " + with_commas(b - 1) + " of them (its ZeRO-1 slice)").c_str()
                                : "steps none of them (its ZeRO-1 slice lies in other units)",
                        u.reducing[ri] ? "; gradient all-reduce under way" : "");
  }
}

// ---- FSDP2 (--fsdp-api 2): each parameter split on dim 0 on its own, padded on its own.

// What a rank holds of a unit's parameters and gradients, in DTensor's words (docs/course_sources.md §11b);
// `compact` for a narrow window (the tooltip says it in full).
std::string placement(const UnitView& u, int r, int K, int W, bool compact) {
  const size_t i = static_cast<size_t>(r);
  // (W / stride: the data-parallel ranks; an expert unit is Shard(0) over the ranks holding its experts)
  const bool hsdp = !u.experts && K < W / std::max(1, u.owner_stride);
  std::string out;
  if (u.gathered[i]) out = compact ? "full" : "full (unsharded)";
  else if (u.post_forward[i] > 0) out = "Shard(0) over " + std::to_string(u.post_forward[i]) + (compact ? "" : " ranks");
  else out = hsdp ? (compact ? "(R, Shard(0))" : "(Replicate(), Shard(0))") : "Shard(0)";
  const FsdpState st = u.state[i];
  // Between its gradient's computation and the reduce-scatter's end a rank holds a partial sum of
  // the whole gradient (its own batch's); after it, .grad is sharded like the parameter.
  if ((st == FsdpState::PreBackward && u.gathered[i]) || st == FsdpState::PostBackward)
    out += compact ? " + Partial" : "  \xC2\xB7  grad Partial()";
  return out;
}

// The placement column's widest text for this run (its mesh and reshard setting).
std::string widest_placement(const RunConfigView& c, int K, bool compact) {
  UnitView u;
  u.gathered = {0};
  u.post_forward = {static_cast<int16_t>(std::max(0, c.reshard_after_forward > 1 ? c.reshard_after_forward : 0))};
  u.state = {FsdpState::PostBackward};
  std::string a = placement(u, 0, K, c.world, compact);
  u.post_forward = {0};
  u.gathered = {1};
  std::string b = placement(u, 0, K, c.world, compact);
  u.gathered = {0};
  std::string d = placement(u, 0, K, c.world, compact);
  for (const std::string* t : {&b, &d})
    if (ImGui::CalcTextSize(t->c_str()).x > ImGui::CalcTextSize(a.c_str()).x) a = *t;
  return a;
}

void draw_unit_fsdp2(const Snapshot& s, const UnitView& u, const ShardLayout& L, double time) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float fs = ImGui::GetFontSize();
  const int W = s.config.world, K = std::max(1, u.shard_world);
  const Live live = live_of(s, u);
  const bool live_now = live != Live::None && s.collective.in_flight;
  const size_t P = u.names.size();
  std::vector<Dim0Shard> d(P);
  for (size_t i = 0; i < P; i++) d[i] = dim0_shard(i < u.shapes.size() ? u.shapes[i] : Shape{u.sizes[i]}, K);
  ImGui::Text("unit %d", u.index);
  char split[160];
  std::snprintf(split, sizeof split, "%s elements, each parameter cut on dim 0 in %d chunks: %s a rank with padding", with_commas(u.numel).c_str(), K,
                with_commas(u.chunk).c_str());
  draw_unit_title(s, split, live);

  // Each parameter gets a span of the bar: its padded size's share, at least 4 em, so a bias shows.
  std::vector<float> x0(P + 1, L.bar_x);
  {
    const float gap = 0.35f * fs, min_w = std::min(4.0f * fs, L.bar_w / static_cast<float>(2 * std::max<size_t>(P, 1)));
    float fixed = 0, rest = 0;
    for (size_t i = 0; i < P; i++) rest += static_cast<float>(d[i].padded_numel());
    const float avail = L.bar_w - gap * static_cast<float>(P > 0 ? P - 1 : 0);
    std::vector<float> w(P);
    for (size_t i = 0; i < P; i++) {
      w[i] = avail * static_cast<float>(d[i].padded_numel()) / std::max(1.0f, rest);
      if (w[i] < min_w) fixed += min_w - w[i], w[i] = min_w;
    }
    // Take what the small ones gained from the large ones, in proportion.
    float large = 0;
    for (size_t i = 0; i < P; i++) large += w[i] > min_w ? w[i] : 0;
    for (size_t i = 0; i < P; i++)
      if (w[i] > min_w && large > 0) w[i] = std::max(min_w, w[i] - fixed * w[i] / large);
    for (size_t i = 0; i < P; i++) x0[i + 1] = x0[i] + w[i] + (i + 1 < P ? gap : 0);
  }
  auto cell = [&](size_t i, int k, float y, float h, ImVec2* c0, ImVec2* c1) {
    const float w = (x0[i + 1] - x0[i] - (i + 1 < P ? 0.35f * fs : 0)) / static_cast<float>(K);
    *c0 = ImVec2(x0[i] + w * static_cast<float>(k) + 1, y + 1);
    *c1 = ImVec2(x0[i] + w * static_cast<float>(k + 1) - 1, y + h);
  };
  // ---- the parameters: each one's padded all-gather output, its chunks coloured by owner
  ImVec2 p = ImGui::GetCursorScreenPos();
  const float h = L.row_h * 0.8f;
  // Their names and shapes on a line of their own, above their spans.
  for (size_t i = 0; i < P; i++) {
    // The name and shape, or the name alone, whichever fits its span (the tooltip has both).
    std::string lab = u.names[i] + (i < u.shapes.size() ? " " + shape_str(u.shapes[i]) : std::string());
    const float room = x0[i + 1] - x0[i] - 4;
    auto width = [&](const std::string& t) { return ImGui::GetFont()->CalcTextSizeA(fs * 0.85f, FLT_MAX, 0.0f, t.c_str()).x; };
    if (width(lab) > room) lab = u.names[i];
    if (width(lab) > room) continue;
    dl->AddText(ImGui::GetFont(), fs * 0.85f, ImVec2(x0[i] + 2, p.y), IM_COL32(200, 200, 208, 255), lab.c_str());
  }
  ImGui::Dummy(ImVec2(L.label_w + L.bar_w, fs * 0.95f));
  p = ImGui::GetCursorScreenPos();
  dl->AddText(ImVec2(p.x, p.y), IM_COL32(170, 170, 178, 255), "params");
  for (size_t i = 0; i < P; i++) {
    for (int k = 0; k < K; k++) {
      ImVec2 c0, c1;
      cell(i, k, p.y, h, &c0, &c1);
      dl->AddRectFilled(c0, c1, rank_color(k, W, 0.85f));
      const int64_t real = d[i].real_rows(k);
      if (real < d[i].chunk_rows) {
        const float px = c0.x + (c1.x - c0.x) * static_cast<float>(real) / static_cast<float>(std::max<int64_t>(1, d[i].chunk_rows));
        hatch(dl, ImVec2(px, c0.y), c1, IM_COL32(30, 30, 34, 200));
      }
    }
  }
  ImGui::Dummy(ImVec2(L.label_w + L.bar_w, L.row_h));
  if (ImGui::IsItemHovered()) {
    const float mx = ImGui::GetIO().MousePos.x;
    for (size_t i = 0; i < P; i++)
      if (mx >= x0[i] && mx < x0[i + 1]) {
        ImGui::SetTooltip("%s %s: %lld rows x %lld, cut on dim 0 in %d chunks of %lld rows (torch.chunk);\n"
                          "%lld padding rows at the end (each parameter padded on its own, no flat parameter)",
                          u.names[i].c_str(), i < u.shapes.size() ? shape_str(u.shapes[i]).c_str() : "", static_cast<long long>(d[i].rows),
                          static_cast<long long>(d[i].cols), K, static_cast<long long>(d[i].chunk_rows),
                          static_cast<long long>(d[i].chunk_rows * K - d[i].rows));
        break;
      }
  }
  // ---- one row per rank
  const float pulse = 0.55f + 0.45f * static_cast<float>(std::sin(time * 6.0));
  for (int r = 0; r < W && r < static_cast<int>(u.state.size()); r++) {
    p = ImGui::GetCursorScreenPos();
    const float y = p.y;
    draw_rank_label(L, p, r, u, s);
    const size_t ri = static_cast<size_t>(r);
    const bool gathered = u.gathered[ri] != 0;
    const int pf = u.post_forward[ri];
    for (size_t i = 0; i < P; i++)
      for (int k = 0; k < K; k++) {
        ImVec2 c0, c1;
        cell(i, k, y, h, &c0, &c1);
        const bool own = k == u.owned_chunk(r);
        // reshard_after_forward=N: this rank keeps chunks [g K/N, (g+1) K/N) of each parameter, g = its place in its group.
        const bool kept = pf > 0 && k / (K / pf) == u.owned_chunk(r) % pf;
        ImU32 fill = own ? rank_color(k, W, 0.95f) : gathered ? rank_color(k, W, 0.40f) : kept ? rank_color(k, W, 0.65f) : 0;
        if (live != Live::None && ri < s.collective.cells.size()) {
          const int held = s.collective.cells[ri][static_cast<size_t>(k)];
          if (live == Live::Gather) fill = held > 0 ? rank_color(k, W, own ? 0.95f : 0.55f) : 0;
          else fill = contribution_color(held, s.collective.world);
        }
        dl->AddRect(c0, c1, IM_COL32(90, 92, 100, 255));
        if (fill) dl->AddRectFilled(c0, c1, fill);
        if (own) dl->AddRect(c0, c1, IM_COL32(255, 255, 255, 220), 0, 0, 2.0f);
        const int64_t real = d[i].real_rows(k);
        if (real < d[i].chunk_rows && fill) {
          const float px = c0.x + (c1.x - c0.x) * static_cast<float>(real) / static_cast<float>(std::max<int64_t>(1, d[i].chunk_rows));
          hatch(dl, ImVec2(px, c0.y), c1, IM_COL32(20, 20, 24, 170));
        }
      }
    const ImVec2 b0(L.bar_x, y), b1(L.bar_x + L.bar_w, y + h + 1);
    if (u.gathering[ri] && !live_now) dl->AddRect(b0, b1, with_alpha(IM_COL32(110, 190, 255, 255), pulse), 0, 0, 2.0f);
    if (u.reducing[ri] && !live_now) dl->AddRect(b0, b1, with_alpha(IM_COL32(255, 160, 60, 255), pulse), 0, 0, 2.0f);
    const FsdpState st = u.state[ri];
    const std::string where = placement(u, r, K, W, L.compact);
    dl->AddText(ImVec2(L.bar_x + L.bar_w + 0.6f * fs, y), state_color(st), where.c_str());
    ImGui::Dummy(ImVec2(L.label_w + L.bar_w + L.state_w, L.row_h));
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("rank %d, unit %d: %s\nholds chunk %d of every parameter%s%s", r, u.index, fsdp_state_name(st), u.owned_chunk(r),
                        gathered ? ", and the full parameters (copied out of the all-gather)"
                        : pf > 0 ? ", and its 1/N of each parameter kept after forward (reshard_after_forward=N)"
                                 : "",
                        u.reducing[ri] ? "; gradient reduce-scatter under way" : "");
  }
}

// FSDP1's flat split against FSDP2's per-parameter split of this run's units: what each rank keeps
// and what one forward's all-gathers move, from the same shapes.
void draw_api_comparison(const Snapshot& s) {
  const RunConfigView& c = s.config;
  const int K = std::max(1, s.units.front().shard_world);
  std::vector<std::vector<Shape>> units;
  for (const UnitView& u : s.units) units.push_back(u.shapes);
  const FsdpLayoutBytes b = fsdp_layout_bytes(units, K);
  const int64_t gather_bytes = is_mixed(c.precision) ? 2 : 4;
  if (!ImGui::CollapsingHeader("FSDP1 vs FSDP2")) return;
  ImGui::PushTextWrapPos(0.0f);
  auto line = [&](const char* name, int64_t shard, int64_t gather, bool mine) {
    const std::string text = std::string(name) + (mine ? " (this run)" : "") + ": " + with_commas(shard) + " elements a rank (" +
                             human_bytes(shard * 4) + " fp32), " + with_commas(shard * K - b.real_elems) + " of them padding over the " +
                             std::to_string(K) + " ranks; one forward all-gathers " + human_bytes(gather * gather_bytes);
    if (mine) ImGui::TextColored(ImVec4(1.0f, 0.85f, 0.4f, 1.0f), "%s", text.c_str());
    else ImGui::TextUnformatted(text.c_str());
  };
  line("FSDP1 FlatParameter", b.fsdp1_shard_elems, b.fsdp1_gather_elems, c.fsdp_api == 1);
  line("FSDP2 fully_shard", b.fsdp2_shard_elems, b.fsdp2_gather_elems, c.fsdp_api == 2);
  ImGui::TextDisabled("FSDP1 pads each unit's flat parameter to a multiple of %d; FSDP2 pads every parameter's rows to one, so a "
                      "small tensor can cost a row per rank. The reduce-scatter moves what the all-gather does.",
                      K);
  ImGui::PopTextWrapPos();
}

void draw_legend(float fs, int W, bool replicated) {
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
  if (replicated) {  // NO_SHARD, ZeRO-1: nothing is gathered or scattered; the optimizer state may be split
    swatch(rank_color(0, W, 0.95f), true, "what it steps (its optimizer state)");
    swatch(rank_color(0, W, 0.40f), false, "the full parameters it holds");
  } else {
    swatch(rank_color(0, W, 0.95f), true, "its own shard");
    swatch(rank_color(0, W, 0.40f), false, "gathered copy");
    swatch(contribution_color(1, 4), false, "partial sum");
    swatch(contribution_color(4, 4), false, "reduced");
  }
  const char* lines = replicated ? "white lines: parameter boundaries" : "white lines: parameter boundaries; hatched: zero padding";
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
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextDisabled("Waiting for FSDP to lay out its units...");
    ImGui::PopTextWrapPos();
    return;
  }
  const RunConfigView& c = s.config;
  const int K = s.units.front().shard_world;
  // Beside --tp each TP rank's slice of the model is sharded over the D = world / tp data-parallel ranks.
  const int T = std::max(1, s.mesh.shape.tp), D = std::max(1, c.world / T);
  const std::string over = T > 1 ? std::to_string(c.world) + " ranks (" + std::to_string(D) + " data-parallel x --tp " + std::to_string(T) +
                                       ": each TP rank's slice sharded over its " + std::to_string(D) + ")"
                                 : std::to_string(c.world) + " ranks";
  const char* keeper = T > 1 ? "data-parallel rank d keeps chunk d" : "rank r keeps chunk r";
  ImGui::PushTextWrapPos(0.0f);
  if (c.fsdp_api == 2) {
    ImGui::TextWrapped("fully_shard (FSDP2), %s%s: each parameter cut on dim 0 in %d chunks, padded on its own; %s. %s",
                       over.c_str(), K < D ? (", HSDP groups of " + std::to_string(K)).c_str() : "", K, keeper,
                       c.reshard_after_forward == 0  ? "Gathered to compute, kept until backward."
                       : c.reshard_after_forward > 1 ? ("After forward each rank keeps 1/" + std::to_string(c.reshard_after_forward) +
                                                        ", gathered again in groups of " + std::to_string(c.reshard_after_forward) + ".")
                                                           .c_str()
                                                     : "Gathered to compute, freed after.");
  } else if (c.sharding == Sharding::NoShard || c.sharding == Sharding::Zero1) {
    ImGui::TextWrapped("%s keeps the full parameters on every rank; only %s.", sharding_name(c.sharding),
                       c.sharding == Sharding::Zero1 ? "the optimizer state is split: each rank steps 1/W of the whole flat parameter "
                                                       "vector (under --ep: of the dense parameters, and 1/(W/ep) of its experts), "
                                                       "then all-gathers the updated slices"
                                                     : "gradients are all-reduced, unit by unit");
  } else {
    ImGui::TextWrapped("%s over %s%s: each unit's flat parameter is split in %d chunks; %s%s. "
                       "An all-gather rebuilds a unit before it computes%s; its gradient is reduce-scattered back to the owners.",
                       sharding_name(c.sharding), over.c_str(),
                       K < D ? (" in node groups of " + std::to_string(K) + (T > 1 ? " data-parallel ranks" : "")).c_str() : "", K, keeper,
                       K < D ? " of its node" : "",
                       c.sharding == Sharding::ShardGradOp ? " and stays until its backward" : ", then is freed");
  }
  // --ep: an MoE block's experts are a unit of their own, split over fewer ranks than the rest.
  int expert_stride = 1, expert_split = 1;
  for (const UnitView& u : s.units)
    if (u.experts) expert_stride = u.owner_stride, expert_split = u.shard_world;
  if (expert_stride > 1)
    ImGui::TextWrapped("--ep %d: each MoE block's experts are a unit of their own (torchtitan's layout), split over the %d ranks "
                       "holding the same experts (rank r, r + %d, ...)%s; the same unit holds other experts on each EP rank.",
                       expert_stride, expert_split, expert_stride, c.sharding == Sharding::Hybrid ? " in each node, copied across nodes" : "");
  ImGui::PopTextWrapPos();
  draw_legend(fs, c.world, c.fsdp_api == 1 && (c.sharding == Sharding::NoShard || c.sharding == Sharding::Zero1));
  ImGui::Separator();

  ImGui::BeginChild("##list_units", ImVec2(0, 0), false);  // one block per unit: a list that scrolls
  ShardLayout L;
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  // The widest rank label this run draws (draw_rank_label).
  L.label_w = ImGui::CalcTextSize("flat param  ").x;
  for (const char* lab : {expert_stride > 1 ? "rank 00 (EP rank 0)  " : "", K < D && T > 1 ? "rank 00 (node 0, TP 0)  " : "",
                          K < D ? "rank 00 (node 0)  " : "", T > 1 ? "rank 00 (TP 0)  " : ""})
    L.label_w = std::max(L.label_w, ImGui::CalcTextSize(lab).x);
  L.state_w = ImGui::CalcTextSize("post-backward ").x + 0.6f * fs;
  if (c.fsdp_api == 2) {
    // FSDP2's column names the placement: in full, unless that leaves the bars under 10 em.
    const float avail = ImGui::GetContentRegionAvail().x - L.label_w;
    L.state_w = ImGui::CalcTextSize((widest_placement(c, K, false) + " ").c_str()).x + 0.6f * fs;
    L.compact = avail - L.state_w < 10.0f * fs;
    if (L.compact) L.state_w = ImGui::CalcTextSize((widest_placement(c, K, true) + " ").c_str()).x + 0.6f * fs;
  }
  L.bar_x = origin.x + L.label_w;
  L.bar_w = std::max(4.0f * fs, ImGui::GetContentRegionAvail().x - L.label_w - L.state_w);
  L.row_h = fs * 1.15f;
  if (c.sharding != Sharding::NoShard && c.sharding != Sharding::Zero1) draw_api_comparison(s);
  for (const UnitView& u : s.units) {
    if (u.state.empty()) continue;
    if (c.fsdp_api == 2) draw_unit_fsdp2(s, u, L, ctx.time);
    else if (!u.steps.empty()) draw_unit_replicated(s, u, L, ctx.time);
    else draw_unit(s, u, L, ctx.time);
    ImGui::Spacing();
  }
  ImGui::EndChild();
}

}  // namespace dtlab::app
