// The All-to-all view: one all-to-all (the one running, else the last) as an n x n matrix over its
// group, rows the senders and columns the receivers (group ranks, named by their global rank), each cell
// the bytes that pair moved, from the receivers' RingStep events. Pairwise exchange moves one diagonal
// per step (step k - 1: every rank to the rank k after it), so the cells light up a diagonal at a time:
// the step just taken bright, the next one outlined. The diagonal of the matrix is each rank's own
// block, kept: a local copy, never sent. Totals per row (sent) and column (received). Which one: the
// held operation's group's newest, else the newest of the group picked in the combo (else of all).
#include <algorithm>
#include <string>
#include <vector>

#include "app/alltoall_tracker.h"  // pick_alltoall
#include "app/views/views.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

std::string group_word(const AllToAllView& v) { return v.group_name.empty() ? std::string("world") : v.group_name; }

// Several groups have had all-to-alls (cp0 and cp1, ep0 and ep1): which one to show. While the stepper
// holds an operation of one of them, that one, and the combo says so, greyed.
void group_combo(const Snapshot& s, AllToAllViewState& state, const AllToAllView& shown) {
  if (s.alltoall_groups.size() < 2) return;
  ImGui::AlignTextToFramePadding();
  ImGui::TextUnformatted("group");
  ImGui::SameLine();
  const std::string newest = "newest (" + group_word(s.alltoall_groups.front()) + ")";
  const std::string preview = s.alltoall_held ? group_word(shown) + " (the held operation's)" : state.group < 0 ? newest : group_word(shown);
  const float w = std::max(ImGui::CalcTextSize(preview.c_str()).x, ImGui::CalcTextSize(newest.c_str()).x) + ImGui::GetFrameHeight() * 2;
  ImGui::SetNextItemWidth(std::min(w, ImGui::GetContentRegionAvail().x));
  ImGui::BeginDisabled(s.alltoall_held);
  if (ImGui::BeginCombo("##a2a_group", preview.c_str())) {
    if (ImGui::Selectable(newest.c_str(), state.group < 0)) state.group = -1;
    std::vector<const AllToAllView*> by_name;  // a steady order, whichever ran last
    for (const AllToAllView& v : s.alltoall_groups) by_name.push_back(&v);
    std::sort(by_name.begin(), by_name.end(), [](const AllToAllView* a, const AllToAllView* b) { return group_word(*a) < group_word(*b); });
    for (const AllToAllView* v : by_name)
      if (ImGui::Selectable(group_word(*v).c_str(), state.group == v->group)) state.group = v->group;
    ImGui::EndCombo();
  }
  ImGui::EndDisabled();
}

}  // namespace

void draw_alltoall_view(const Snapshot& s, ViewContext& ctx, AllToAllViewState& state) {
  const AllToAllView& a = pick_alltoall(s, state.group);
  if (!a.valid) {
    ImGui::TextWrapped("No all-to-all has run yet. Expert parallelism makes them: a GPT with --moe experts=4,top_k=2 and "
                       "--strategy ddp --ep 2 sends each token to the rank holding its expert, and back; so does --cp 2 "
                       "--cp-layout ulysses around attention.");
    return;
  }
  group_combo(s, state, a);
  ImGui::TextWrapped("%s", a.label.c_str());
  ImGui::TextWrapped("%s", (a.in_flight ? "step " + std::to_string(a.steps_done) + " of " + std::to_string(a.steps) +
                                              " done; the outlined cells move next"
                                        : "done in " + std::to_string(a.steps) + (a.steps == 1 ? " step" : " steps"))
                               .c_str());
  if (!ctx.presentation)
    ImGui::TextWrapped("%s", a.algo == Algorithm::Grouped
                                 ? "Row: the rank that sends; column: the rank that receives. Grouped (NCCL's all-to-all): every "
                                   "send and receive is posted at once, so every cell moves in one step and the pairs share the "
                                   "links; the grey diagonal is each rank's own block, kept: copied locally, never sent."
                                 : "Row: the rank that sends; column: the rank that receives. Pairwise exchange: at step k each rank "
                                   "sends to the rank k after it, so one diagonal moves per step; the grey diagonal is each rank's "
                                   "own block, kept: copied locally, never sent.");
  const int n = a.n;
  const ImVec2 p0 = ImGui::GetCursorScreenPos(), avail = ImGui::GetContentRegionAvail();
  const float fs = ImGui::GetFontSize();
  const float head_w = ImGui::CalcTextSize("rank 00  ").x, head_h = fs * 1.6f;
  // n cells and a totals column / row, square, as large as the window allows.
  const float cell = std::max(fs * 2.0f, std::min((avail.x - head_w) / (n + 1.4f), (avail.y - head_h - fs * 2.2f) / (n + 1.4f)));
  ImGui::InvisibleButton("##a2a", ImVec2(std::max(1.0f, head_w + cell * (n + 1.4f)), std::max(1.0f, head_h + cell * (n + 1.4f))));
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const ImVec2 o(p0.x + head_w, p0.y + head_h);
  int64_t most = 1;
  for (int64_t b : a.bytes) most = std::max(most, b);
  auto rank_name = [&](int i) { return "rank " + std::to_string(a.members[static_cast<size_t>(i)]); };
  const ImU32 lit = IM_COL32(255, 214, 80, 255), next = IM_COL32(120, 200, 255, 255);
  int hovered = -1;
  for (int i = 0; i < n; i++) {
    const std::string r = rank_name(i);
    dl->AddText(ImVec2(p0.x, o.y + cell * (i + 0.5f) - fs / 2), kText, r.c_str());
    centered_text(dl, ImVec2(o.x + cell * (i + 0.5f), p0.y + head_h / 2), kText, fit_text(r, cell - 4));
    for (int j = 0; j < n; j++) {
      const ImVec2 c0(o.x + cell * j + 1, o.y + cell * i + 1), c1(c0.x + cell - 2, c0.y + cell - 2);
      const int64_t b = a.at(i, j);
      const int step = a.step_of(i, j);
      ImU32 fill = kBox;
      if (b >= 0 && i == j) fill = IM_COL32(90, 94, 104, 255);
      else if (b >= 0) fill = with_alpha(IM_COL32(70, 140, 230, 255), 0.25f + 0.75f * static_cast<float>(b) / static_cast<float>(most));
      dl->AddRectFilled(c0, c1, fill);
      if (i != j && b >= 0 && step == a.newest_step && a.in_flight) dl->AddRect(c0, c1, lit, 0, 0, 3);
      if (i != j && a.in_flight && step == a.steps_done) dl->AddRect(c0, c1, next, 0, 0, 2);
      const std::string t = b < 0 ? "?" : human_bytes(b);
      const ImVec2 mid((c0.x + c1.x) / 2, (c0.y + c1.y) / 2);
      if (i == j && b >= 0 && cell > fs * 3) {  // the own block: its bytes, and that they stay
        centered_text(dl, ImVec2(mid.x, mid.y - fs * 0.55f), ink_on(fill), fit_text(t, cell - 6));
        centered_text(dl, ImVec2(mid.x, mid.y + fs * 0.55f), ink_on(fill), fit_text("kept", cell - 6));
      } else {
        centered_text(dl, mid, b < 0 ? kDim : ink_on(fill), fit_text(i == j && b >= 0 ? t + " kept" : t, cell - 6));
      }
      if (ImGui::IsMouseHoveringRect(c0, c1)) hovered = i * n + j;
    }
  }
  // Totals: what each rank sends to the others (its issue says it before any step), what each receives.
  const float tx = o.x + cell * n + cell * 0.2f, ty = o.y + cell * n + cell * 0.2f;
  centered_text(dl, ImVec2(tx + cell * 0.6f, p0.y + head_h / 2), kDim, fit_text("sent", cell * 1.2f));
  dl->AddText(ImVec2(p0.x, ty + cell * 0.3f - fs / 2), kDim, "received");
  for (int i = 0; i < n; i++) {
    const int64_t sent = a.sent[static_cast<size_t>(i)];
    centered_text(dl, ImVec2(tx + cell * 0.6f, o.y + cell * (i + 0.5f)), kText, fit_text(sent < 0 ? "?" : human_bytes(sent), cell * 1.2f));
    int64_t got = 0;
    bool known = true;
    for (int k = 0; k < n; k++)
      if (k != i) known = known && a.at(k, i) >= 0, got += std::max<int64_t>(0, a.at(k, i));
    centered_text(dl, ImVec2(o.x + cell * (i + 0.5f), ty + cell * 0.3f), known ? kText : kDim,
                  fit_text(human_bytes(got) + (known ? "" : "+"), cell - 4));
  }
  if (hovered >= 0) {
    const int i = hovered / n, j = hovered % n;
    const int64_t b = a.at(i, j);
    ImGui::SetTooltip("%s", (rank_name(i) + " -> " + rank_name(j) + ": " +
                             (i == j ? (b < 0 ? "its own block" : human_bytes(b) + ", its own block, kept: copied locally, never sent")
                                     : (b < 0 ? "not moved yet" : human_bytes(b)) + " at step " + std::to_string(a.step_of(i, j) + 1) +
                                           " of " + std::to_string(a.steps)))
                                .c_str());
  }
}

}  // namespace dtlab::app
