// The All-to-all view: the newest all-to-all of the run (the one running, else the last) as an n x n
// matrix over its group, rows the senders and columns the receivers (group ranks, named by their
// global rank), each cell the bytes that pair moved, from the receivers' RingStep events. Pairwise
// exchange moves one diagonal per step (step k - 1: every rank to the rank k after it), so the cells
// light up a diagonal at a time: the step just taken bright, the next one outlined. The diagonal of
// the matrix is each rank's own block, a local copy. Totals per row (sent) and column (received).
#include <algorithm>
#include <string>

#include "app/views/views.h"
#include "engine/core/format.h"

namespace dtlab::app {

void draw_alltoall_view(const Snapshot& s, ViewContext& ctx) {
  const AllToAllView& a = s.alltoall;
  if (!a.valid) {
    ImGui::TextWrapped("No all-to-all has run yet. Expert parallelism makes them: a GPT with --moe experts=4,top_k=2 and "
                       "--strategy ddp --ep 2 sends each token to the rank holding its expert, and back.");
    return;
  }
  ImGui::TextWrapped("%s", a.label.c_str());
  ImGui::TextWrapped("%s", (a.in_flight ? "step " + std::to_string(a.steps_done) + " of " + std::to_string(a.steps) +
                                              " done; the outlined cells move next"
                                        : "done in " + std::to_string(a.steps) + (a.steps == 1 ? " step" : " steps"))
                               .c_str());
  if (!ctx.presentation)
    ImGui::TextWrapped("Row: the rank that sends; column: the rank that receives. At step k each rank sends to the rank k "
                       "after it, so one diagonal moves per step; the grey diagonal is a rank's own tokens, copied locally.");
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
      centered_text(dl, ImVec2((c0.x + c1.x) / 2, (c0.y + c1.y) / 2), b < 0 ? kDim : ink_on(fill), fit_text(t, cell - 6));
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
                             (i == j ? (b < 0 ? "its own block" : human_bytes(b) + ", its own block, copied locally")
                                     : (b < 0 ? "not moved yet" : human_bytes(b)) + " at step " + std::to_string(a.step_of(i, j) + 1) +
                                           " of " + std::to_string(a.steps)))
                                .c_str());
  }
}

}  // namespace dtlab::app
