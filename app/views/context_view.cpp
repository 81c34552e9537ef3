// The Context view (--cp): one CP group (the stepper's focus's, else the first) and its sequence.
//   - The sequence: T positions, each coloured by the rank holding it (contiguous chunks, zigzag's
//     chunks r and 2c-1-r, or Ulysses' chunks and then its head split).
//   - Ring and zigzag: a row per rank and a column per ring step of its pass now running (or the last
//     one): the causal mask between the rank's queries and the K/V block it met at that step, lit once
//     computed, dim while to come, empty where the mask hides the whole block; the row's total pairs
//     as a bar beside it (the contiguous ring's last rank does c blocks, the first 1; zigzag's equal).
//   - The ring: the ranks round a circle and, while a pass runs, the K/V block each sends next.
// Read while the run stands still (Session::read_context); nothing here is invented between reads.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "app/views/views.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

// The CP rank (index in `group`) holding each position of the sequence.
std::vector<int> owners(const ContextView& x, const std::vector<int>& group) {
  std::vector<int> own(static_cast<size_t>(x.ctx), -1);
  for (size_t i = 0; i < group.size(); i++)
    for (int64_t p : x.ranks[static_cast<size_t>(group[i])].positions)
      if (p >= 0 && p < x.ctx) own[static_cast<size_t>(p)] = static_cast<int>(i);
  return own;
}

// A bar of T cells coloured by owner, "rank r" under each run of one owner.
void sequence_bar(ImDrawList* dl, ImVec2 a, float w, float h, const std::vector<int>& own, const std::vector<int>& group, int world) {
  const float fs = ImGui::GetFontSize(), cell = w / static_cast<float>(std::max<size_t>(own.size(), 1));
  for (size_t t = 0; t < own.size();) {
    size_t e = t;
    while (e < own.size() && own[e] == own[t]) e++;
    const ImVec2 p0(a.x + cell * static_cast<float>(t), a.y), p1(a.x + cell * static_cast<float>(e), a.y + h);
    const ImU32 col = own[t] >= 0 ? rank_color(group[static_cast<size_t>(own[t])], world) : kBox;
    dl->AddRectFilled(p0, p1, col);
    dl->AddRect(p0, p1, IM_COL32(20, 22, 26, 255));
    if (own[t] >= 0)
      centered_text(dl, ImVec2((p0.x + p1.x) / 2, p1.y + fs * 0.6f), kText,
                    fit_text("rank " + std::to_string(group[static_cast<size_t>(own[t])]), p1.x - p0.x));
    t = e;
  }
  dl->AddText(ImVec2(a.x, a.y - fs * 1.2f), kDim, fit_text("position 0", w / 2).c_str());
  const std::string last = "position " + std::to_string(own.size() - 1);
  dl->AddText(ImVec2(a.x + w - ImGui::CalcTextSize(last.c_str()).x, a.y - fs * 1.2f), kDim, last.c_str());
}

// The causal mask of queries `q` against keys `k` in [a, b]: a filled cell where key <= query, at
// most 32 x 32 cells (longer sides sampled).
void mask_cell(ImDrawList* dl, ImVec2 a, ImVec2 b, const std::vector<int64_t>& q, const std::vector<int64_t>& k, ImU32 col) {
  const int nq = static_cast<int>(std::min<size_t>(q.size(), 32)), nk = static_cast<int>(std::min<size_t>(k.size(), 32));
  if (nq == 0 || nk == 0) return;
  const float cw = (b.x - a.x) / static_cast<float>(nk), ch = (b.y - a.y) / static_cast<float>(nq);
  for (int i = 0; i < nq; i++) {
    const int64_t qp = q[static_cast<size_t>(i) * q.size() / static_cast<size_t>(nq)];
    for (int j = 0; j < nk; j++)
      if (k[static_cast<size_t>(j) * k.size() / static_cast<size_t>(nk)] <= qp)
        dl->AddRectFilled(ImVec2(a.x + cw * static_cast<float>(j), a.y + ch * static_cast<float>(i)),
                          ImVec2(a.x + cw * static_cast<float>(j + 1), a.y + ch * static_cast<float>(i + 1)), col);
  }
}

void arrow(ImDrawList* dl, ImVec2 a, ImVec2 b, ImU32 col, float thick) {
  dl->AddLine(a, b, col, thick);
  const float dx = b.x - a.x, dy = b.y - a.y, len = std::max(1.0f, std::sqrt(dx * dx + dy * dy));
  const float ux = dx / len, uy = dy / len, s = thick * 4;
  dl->AddTriangleFilled(b, ImVec2(b.x - ux * s - uy * s * 0.6f, b.y - uy * s + ux * s * 0.6f),
                        ImVec2(b.x - ux * s + uy * s * 0.6f, b.y - uy * s - ux * s * 0.6f), col);
}

// The block controls: follow the running pass, or pick a block and a way. While following they show
// the running one; touching them stops following.
void block_controls(ContextViewState& state, int layers, int run_block, bool run_backward) {
  if (state.follow) state.block = std::max(run_block, 0), state.backward = run_backward;
  const ImGuiStyle& st = ImGui::GetStyle();
  const float box = ImGui::GetFrameHeight() + st.ItemInnerSpacing.x;
  const char* kFollow = "follow the running pass";
  ImGui::Checkbox(kFollow, &state.follow);
  const std::string name = "block " + std::to_string(state.block);
  const float combo_w = ImGui::CalcTextSize(("block " + std::to_string(std::max(layers - 1, 0))).c_str()).x + ImGui::GetFrameHeight() * 1.6f;
  flow(combo_w);
  ImGui::SetNextItemWidth(combo_w);
  if (ImGui::BeginCombo("##context_block", name.c_str())) {
    for (int l = 0; l < layers; l++)
      if (ImGui::Selectable(("block " + std::to_string(l)).c_str(), l == state.block)) state.block = l, state.follow = false;
    ImGui::EndCombo();
  }
  for (const bool back : {false, true}) {
    const char* word = back ? "backward" : "forward";
    flow(box + ImGui::CalcTextSize(word).x);
    if (ImGui::RadioButton(word, state.backward == back)) state.backward = back, state.follow = false;
  }
}

}  // namespace

void draw_context_view(const Snapshot& s, ViewContext& ctx, ContextViewState& state) {
  const ContextView& x = s.context;
  if (!x.cp) {
    ImGui::TextWrapped("This run keeps every sample's sequence on each rank: start a GPT with --strategy ddp --world 4 --cp 4 "
                       "(--cp-layout ring, zigzag or ulysses) to split it.");
    return;
  }
  if (!x.read || x.groups.empty()) {
    ImGui::TextWrapped("The CP ranks' chunks and ring passes are read when the run stands still: pause it (Space) or step (C, I).");
    return;
  }
  const int world = static_cast<int>(x.ranks.size());
  const std::vector<int>* focus = s.stepper.focus_rank >= 0 ? x.group_of(s.stepper.focus_rank) : nullptr;
  const std::vector<int>& group = focus ? *focus : x.groups.front();
  const int c = static_cast<int>(group.size());
  const ContextRankView& first_rank = x.ranks[static_cast<size_t>(group.front())];
  const bool ring = x.layout != CpLayout::Ulysses;
  const int layers = static_cast<int>(first_rank.passes.size());
  if (ring && layers > 0) block_controls(state, layers, first_rank.block, first_rank.pass().valid && first_rank.pass().backward);
  // Each rank's pass drawn: the one it runs now (or ran last), else the chosen block's that way.
  auto pass_of = [&](const ContextRankView& rv) -> const ContextPassView& {
    return state.follow ? rv.pass() : rv.pass(state.block, state.backward);
  };
  const ContextPassView& first = pass_of(first_rank);
  const int shown_block = state.follow ? first_rank.block : state.block;
  std::string members;
  for (int m : group) members += (members.empty() ? "" : ",") + std::to_string(m);
  std::string pass = state.follow ? "no pass yet"
                     : state.block >= layers ? "no block " + std::to_string(state.block) + " (the model has " + std::to_string(layers) + ")"
                                             : "block " + std::to_string(state.block) + (state.backward ? " backward" : " forward") + ": not run yet";
  if (ring && first.valid)
    pass = std::string("block ") + std::to_string(shown_block) + (first.backward ? " backward" : " forward") + ", ring step " +
           std::to_string(first.steps_done) + " of " + std::to_string(c) + (first.steps_done == c ? " (done)" : "");
  ImGui::TextWrapped("cp %d, %s layout, T %lld: ranks %s; %s; at step %lld", c, cp_layout_name(x.layout),
                     static_cast<long long>(x.ctx), members.c_str(), ring ? pass.c_str() : "attention by all-to-alls",
                     static_cast<long long>(x.at_step));
  const float fs = ImGui::GetFontSize();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton("##context", ImVec2(std::max(1.0f, avail.x), std::max(fs * 10, avail.y)));
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float w = avail.x, h = std::max(fs * 10, avail.y);
  const std::vector<int> own = owners(x, group);
  float y = p0.y + fs * 1.3f;
  sequence_bar(dl, ImVec2(p0.x, y), w, fs * 1.6f, own, group, world);
  y += fs * 3.6f;
  if (!ring) {
    // Ulysses: before attention the sequence split, during it the head split (every position of H/c heads).
    const float rows_h = std::min(h - (y - p0.y) - fs * 2, fs * 1.2f * static_cast<float>(x.heads));
    dl->AddText(ImVec2(p0.x, y), kText,
                fit_text("during attention: each rank holds " + std::to_string(x.heads / c) + " of the " + std::to_string(x.heads) +
                             " heads for all " + std::to_string(x.ctx) + " positions (an all-to-all there, one back after)",
                         w).c_str());
    y += fs * 1.4f;
    const float rh = rows_h / static_cast<float>(std::max<int64_t>(x.heads, 1));
    for (int64_t hd = 0; hd < x.heads; hd++) {
      const int r = static_cast<int>(hd / std::max<int64_t>(x.heads / c, 1));
      const ImVec2 a(p0.x + fs * 4, y + rh * static_cast<float>(hd)), b(p0.x + w, y + rh * static_cast<float>(hd + 1) - 1);
      dl->AddRectFilled(a, b, rank_color(group[static_cast<size_t>(std::min(r, c - 1))], world));
      dl->AddText(ImVec2(p0.x, a.y + (rh - fs) / 2), kDim, ("head " + std::to_string(hd)).c_str());
    }
    return;
  }
  // Ring and zigzag: rank x step cells, the rank's total beside them, the ring at the right.
  const float ring_w = std::min(w * 0.28f, h * 0.7f), grid_w = w - ring_w - fs * 11, label_w = fs * 4.5f;
  const float cell = std::min((grid_w - label_w) / static_cast<float>(c), (h - (y - p0.y) - fs * 2.4f) / static_cast<float>(c));
  if (cell < fs) {
    dl->AddText(ImVec2(p0.x, y), kDim, fit_text("Make the window larger to see the ring steps.", w).c_str());
    return;
  }
  for (int st = 0; st < c; st++)
    centered_text(dl, ImVec2(p0.x + label_w + cell * (static_cast<float>(st) + 0.5f), y + fs * 0.5f), kDim, fit_text("step " + std::to_string(st), cell));
  y += fs * 1.2f;
  std::vector<int64_t> totals(static_cast<size_t>(c), 0);
  for (int i = 0; i < c; i++)
    for (int64_t p : pass_of(x.ranks[static_cast<size_t>(group[static_cast<size_t>(i)])]).pairs) totals[static_cast<size_t>(i)] += p;
  const int64_t most = std::max<int64_t>(1, *std::max_element(totals.begin(), totals.end()));
  for (int i = 0; i < c; i++) {
    const ContextRankView& rv = x.ranks[static_cast<size_t>(group[static_cast<size_t>(i)])];
    const ContextPassView& r = pass_of(rv);
    const float ry = y + cell * static_cast<float>(i);
    dl->AddText(ImVec2(p0.x, ry + (cell - fs) / 2), kText, fit_text("rank " + std::to_string(rv.rank), label_w).c_str());
    int blocks = 0;
    for (int st = 0; st < c; st++) {
      const ImVec2 a(p0.x + label_w + cell * static_cast<float>(st) + 2, ry + 2), b(a.x + cell - 4, ry + cell - 4);
      const bool known = st < static_cast<int>(r.held.size()) && r.held[static_cast<size_t>(st)] >= 0;
      const bool done = known && st < r.steps_done;
      dl->AddRect(a, b, with_alpha(kBoxEdge, done ? 1.0f : 0.5f));
      if (!known) continue;
      const int j = r.held[static_cast<size_t>(st)];
      const int holder = group[static_cast<size_t>(j)];
      const int64_t pairs = r.pairs[static_cast<size_t>(st)];
      mask_cell(dl, a, b, rv.positions, x.ranks[static_cast<size_t>(holder)].positions, rank_color(holder, world, done ? 0.9f : 0.25f));
      if (done && pairs > 0) blocks++;
      if (done && st == r.steps_done - 1 && r.steps_done < c) dl->AddRect(a, b, IM_COL32(255, 220, 90, 255), 0, 0, 3);  // the step just computed
      centered_text(dl, ImVec2((a.x + b.x) / 2, b.y - fs * 0.6f), pairs > 0 ? kText : kDim,
                    fit_text(pairs > 0 ? "K/V " + std::to_string(holder) : "masked", b.x - a.x));
    }
    // The row's work: bar of its pairs over the busiest rank's.
    const float bx = p0.x + label_w + cell * static_cast<float>(c) + fs * 0.5f, bw = fs * 8.5f;
    const float fill = bw * static_cast<float>(totals[static_cast<size_t>(i)]) / static_cast<float>(most);
    dl->AddRectFilled(ImVec2(bx, ry + cell * 0.3f), ImVec2(bx + fill, ry + cell * 0.7f), rank_color(rv.rank, world));
    dl->AddRect(ImVec2(bx, ry + cell * 0.3f), ImVec2(bx + bw, ry + cell * 0.7f), with_alpha(kBoxEdge, 0.6f));
    dl->AddText(ImVec2(bx, ry + cell * 0.7f), kDim,
                fit_text(std::to_string(blocks) + (blocks == 1 ? " block, " : " blocks, ") + std::to_string(totals[static_cast<size_t>(i)]) +
                             " pairs",
                         bw + fs * 2).c_str());
  }
  dl->AddText(ImVec2(p0.x, y + cell * static_cast<float>(c) + fs * 0.3f), kDim,
              fit_text("each cell: the causal mask of the rank's queries (rows) against the K/V block it met (columns); pairs per "
                       "sample and head",
                       grid_w + fs * 7).c_str());
  // The ring: ranks round a circle; while a pass runs, the block each sends next.
  const ImVec2 centre(p0.x + w - ring_w / 2, y + std::min(ring_w, cell * static_cast<float>(c)) / 2);
  const float rad = std::min(ring_w, cell * static_cast<float>(c)) / 2 - fs * 1.5f;
  if (rad < fs * 1.5f) return;
  auto at = [&](int i) {
    const float t = 2.0f * 3.14159265f * static_cast<float>(i) / static_cast<float>(c) - 3.14159265f / 2;
    return ImVec2(centre.x + rad * std::cos(t), centre.y + rad * std::sin(t));
  };
  for (int i = 0; i < c; i++) {
    const ContextPassView& r = pass_of(x.ranks[static_cast<size_t>(group[static_cast<size_t>(i)])]);
    if (!r.sending || r.steps_done < 1) continue;
    const int st = r.steps_done - 1, to = r.backward ? (i + c - 1) % c : (i + 1) % c;
    const int blk = r.held[static_cast<size_t>(st)];
    // Forward: the K/V block met at the step goes on. Backward: it goes on (but after the last step),
    // with its dK/dV so far (but after the first step: a rank keeps its own block's share).
    const std::string what = !r.backward ? "K/V " : st == 0 ? "K/V " : st == c - 1 ? "dK/dV " : "K/V+dK/dV ";
    const ImVec2 a = at(i), b = at(to);
    const float len = std::max(1.0f, std::sqrt((b.x - a.x) * (b.x - a.x) + (b.y - a.y) * (b.y - a.y)));
    const float k = fs * 1.1f / len;
    // Two ranks send each other their blocks along one line: each arrow keeps to its right-hand side,
    // its label beyond it, so the two neither cross nor share a place.
    const ImVec2 n = c == 2 ? ImVec2(-(b.y - a.y) / len, (b.x - a.x) / len) : ImVec2(0, 0);
    const ImVec2 s0(a.x + (b.x - a.x) * k + n.x * fs * 0.7f, a.y + (b.y - a.y) * k + n.y * fs * 0.7f),
        s1(b.x - (b.x - a.x) * k + n.x * fs * 0.7f, b.y - (b.y - a.y) * k + n.y * fs * 0.7f);
    const ImU32 col = rank_color(group[static_cast<size_t>(blk)], world);
    arrow(dl, s0, s1, col, ctx.presentation ? 4.0f : 3.0f);
    const ImVec2 mid((s0.x + s1.x) / 2, (s0.y + s1.y) / 2);
    const std::string label = what + std::to_string(group[static_cast<size_t>(blk)]);
    const float half = ImGui::CalcTextSize(label.c_str()).x / 2 + fs * 0.6f;
    const float ox = c == 2 ? n.x * half : (mid.x - centre.x) * 0.3f, oy = c == 2 ? n.y * fs * 1.2f : (mid.y - centre.y) * 0.3f;
    centered_text(dl, ImVec2(mid.x + ox, mid.y + oy), kText, label);
  }
  for (int i = 0; i < c; i++) {
    const ImVec2 q = at(i);
    dl->AddCircleFilled(q, fs * 1.0f, rank_color(group[static_cast<size_t>(i)], world));
    centered_text(dl, q, ink_on(rank_color(group[static_cast<size_t>(i)], world)), std::to_string(group[static_cast<size_t>(i)]));
  }
  dl->AddText(ImVec2(centre.x - ring_w / 2, centre.y + rad + fs * 1.3f), kDim,
              fit_text(!first.sending ? "no block in flight" : first.backward ? "in flight: to rank r-1" : "in flight: to rank r+1", ring_w).c_str());
}

}  // namespace dtlab::app
