// The mesh view: the run's ranks laid out by their (dp, pp, tp) coordinates (engine/core/mesh.h,
// torch's init_device_mesh order, tp fastest). Each dp replica is a box of pipeline stages, each
// stage holds one tp group of neighbouring ranks; a pp group is a column of a replica and a dp group
// the same place in every replica. The latest collective's group is lit (its members outlined and
// joined, the others dimmed), and hovering a rank lists which slice of each weight it holds
// (Megatron's column/row split). Everything comes from Snapshot::mesh and the recorder's events.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "app/views/views.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

const ImU32 kStageBox = IM_COL32(56, 61, 71, 255);
const ImU32 kTpEdge = IM_COL32(110, 175, 215, 255);
const ImU32 kLit = IM_COL32(255, 255, 255, 255);

struct Rect {
  ImVec2 a, b;
  bool contains(ImVec2 p) const { return p.x >= a.x && p.x < b.x && p.y >= a.y && p.y < b.y; }
  ImVec2 center() const { return ImVec2((a.x + b.x) * 0.5f, (a.y + b.y) * 0.5f); }
};

// A titled box: the title in the top-left corner when it fits.
void titled_box(ImDrawList* dl, const Rect& r, ImU32 fill, ImU32 edge, const std::string& title) {
  const float fs = ImGui::GetFontSize();
  dl->AddRectFilled(r.a, r.b, fill, 5.0f);
  dl->AddRect(r.a, r.b, edge, 5.0f, 0, 1.5f);
  if (ImGui::CalcTextSize(title.c_str()).x < r.b.x - r.a.x - fs * 0.6f) dl->AddText(ImVec2(r.a.x + fs * 0.35f, r.a.y + fs * 0.15f), kDim, title.c_str());
}

// Where each rank's cell is: replicas in a grid, stages stacked inside, the tp group's ranks in a
// row. Cells grow with the window up to a readable size, no further (a dp-only world is 8 boxes).
std::vector<Rect> layout(const MeshShape& m, ImVec2 p0, ImVec2 size, std::vector<Rect>& replicas, std::vector<Rect>& stages,
                         std::vector<Rect>& tp_boxes) {
  const float fs = ImGui::GetFontSize(), gap = fs * 0.6f, title = fs * 1.4f;
  const int cols = m.dp <= 4 ? m.dp : static_cast<int>(std::ceil(std::sqrt(static_cast<double>(m.dp))));
  const int rows = (m.dp + cols - 1) / cols;
  // A stage: its title, the tp box's title, the cells; a replica: its title and its stages.
  const float max_cell_w = fs * 12.0f, max_cell_h = fs * 5.0f;
  const float max_rw = static_cast<float>(m.tp) * max_cell_w + gap * 4.0f;
  const float max_rh = title + static_cast<float>(m.pp) * (2.0f * title + max_cell_h + gap * 2.0f) + gap;
  const float rw = std::min(max_rw, (size.x - gap * static_cast<float>(cols + 1)) / static_cast<float>(cols));
  const float rh = std::min(max_rh, (size.y - gap * static_cast<float>(rows + 1)) / static_cast<float>(rows));
  std::vector<Rect> cells(static_cast<size_t>(m.world()));
  for (int d = 0; d < m.dp; d++) {
    const ImVec2 a(p0.x + gap + static_cast<float>(d % cols) * (rw + gap), p0.y + gap + static_cast<float>(d / cols) * (rh + gap));
    replicas.push_back({a, ImVec2(a.x + rw, a.y + rh)});
    const float sh = (rh - title - gap * static_cast<float>(m.pp)) / static_cast<float>(m.pp);
    for (int p = 0; p < m.pp; p++) {
      const ImVec2 sa(a.x + gap, a.y + title + static_cast<float>(p) * (sh + gap));
      stages.push_back({sa, ImVec2(a.x + rw - gap, sa.y + sh)});
      const Rect tp{ImVec2(sa.x + gap * 0.6f, sa.y + title), ImVec2(a.x + rw - gap * 1.6f, sa.y + sh - gap * 0.6f)};
      tp_boxes.push_back(tp);
      const float cw = (tp.b.x - tp.a.x - gap * 0.5f) / static_cast<float>(m.tp);
      for (int t = 0; t < m.tp; t++) {
        const ImVec2 ca(tp.a.x + gap * 0.5f + static_cast<float>(t) * cw, tp.a.y + fs * 1.3f);
        cells[static_cast<size_t>(mesh_rank(m, MeshCoord{d, p, t}))] = {ca, ImVec2(ca.x + cw - gap * 0.5f, tp.b.y - gap * 0.5f)};
      }
    }
  }
  return cells;
}

// A rank's coordinates, its groups and its slices of the model, one line each (indented: details).
std::vector<std::string> rank_lines(const MeshView& mv, int rank) {
  const MeshShape& m = mv.shape;
  const MeshCoord c = mesh_coord(m, rank);
  std::vector<std::string> lines{"rank " + std::to_string(rank) + ": dp " + std::to_string(c.dp) + ", pp " + std::to_string(c.pp) +
                                 ", tp " + std::to_string(c.tp)};
  for (MeshDim d : {MeshDim::TP, MeshDim::PP, MeshDim::DP}) {
    if (m.size(d) < 2) continue;
    std::vector<std::string> ranks;
    for (int r : mesh_group(m, d, rank)) ranks.push_back(std::to_string(r));
    lines.push_back("  " + mesh_group_name(m, d, rank) + ": ranks " + join(ranks, ", "));
  }
  lines.push_back(mv.sequence_parallel ? "holds (sequence parallel: activations split by tokens too):" : "holds:");
  if (static_cast<size_t>(rank) >= mv.slices.size() || mv.slices[static_cast<size_t>(rank)].empty())
    lines.push_back("  (the model's split over the stages is not known)");
  else
    for (const std::string& line : mv.slices[static_cast<size_t>(rank)]) lines.push_back("  " + line);
  return lines;
}

void rank_tooltip(const MeshView& mv, int rank) {
  ImGui::BeginTooltip();
  for (const std::string& line : rank_lines(mv, rank)) ImGui::TextUnformatted(line.c_str());
  ImGui::EndTooltip();
}

// Beside the grid, for a projector: the shown rank's lines (the hovered one, else the lit group's first).
void rank_panel(ImDrawList* dl, const MeshView& mv, int rank, ImVec2 at, bool hovered) {
  const float fs = ImGui::GetFontSize();
  dl->AddText(at, kDim, hovered ? "hovered:" : "hover a rank to see what it holds; shown:");
  at.y += fs * 1.4f;
  // Wrapped at the window's edge: a GPT shard's lines name heads and column ranges.
  const float wrap = std::max(fs * 10.0f, ImGui::GetWindowPos().x + ImGui::GetWindowContentRegionMax().x - at.x);
  for (const std::string& line : rank_lines(mv, rank)) {
    dl->AddText(ImGui::GetFont(), fs, at, line.rfind("  ", 0) == 0 ? kDim : kText, line.c_str(), nullptr, wrap);
    at.y += ImGui::CalcTextSize(line.c_str(), nullptr, false, wrap).y + fs * 0.25f;
  }
}

// TextDisabled, wrapped at the window's edge (presentation mode's larger font at 1280 x 720).
void dim_wrapped(const char* text) {
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("%s", text);
  ImGui::PopStyleColor();
}

void header(const Snapshot& s, const MeshGroup& g) {
  const MeshView& mv = s.mesh;
  ImGui::TextWrapped("%s (torch init_device_mesh order: rank = (dp x %d + pp) x %d + tp, tp fastest)%s",
                     describe_mesh(mv.shape).c_str(), mv.shape.pp, mv.shape.tp, mv.sequence_parallel ? ", sequence parallel" : "");
  if (!mv.error.empty()) ImGui::TextColored(ImVec4(1.0f, 0.55f, 0.45f, 1.0f), "%s", mv.error.c_str());
  if (!g.valid) {
    dim_wrapped("No collective yet: step one (C) to light its group. Hover a rank for its slice of each weight.");
    return;
  }
  std::vector<std::string> ranks;
  for (int r : g.ranks) ranks.push_back(std::to_string(r));
  const bool held = s.held.valid && (s.held.kind == GateKind::Collective || s.held.kind == GateKind::RingStep);
  const bool pair = g.name.rfind("send", 0) == 0 || g.name.rfind("recv", 0) == 0;
  if (pair) ImGui::TextWrapped("paused before %s (ranks %s)", g.name.c_str(), join(ranks, ", ").c_str());
  else ImGui::TextWrapped("%s collective: %s in %s (ranks %s)", held ? "paused before" : "latest", collective_name(g.op), g.name.c_str(),
                   join(ranks, ", ").c_str());
  draw_focus_line(s);
  dim_wrapped("Click a rank (or a tp group's title) to follow it in every view; click it again to let go.");
}

// Where the line from a cell's centre toward `to` leaves the cell (so a link never crosses the text).
ImVec2 edge_toward(const Rect& r, ImVec2 to) {
  const ImVec2 c = r.center();
  const float dx = to.x - c.x, dy = to.y - c.y;
  const float hx = (r.b.x - r.a.x) * 0.5f, hy = (r.b.y - r.a.y) * 0.5f;
  const float t = std::min(dx != 0 ? hx / std::fabs(dx) : 1e9f, dy != 0 ? hy / std::fabs(dy) : 1e9f);
  return t >= 1 ? c : ImVec2(c.x + dx * t, c.y + dy * t);
}

// The lit group: members outlined and, for a sub-group, joined edge to edge in group order.
void draw_group(ImDrawList* dl, const std::vector<Rect>& cells, const MeshGroup& g) {
  const bool sub = g.ranks.size() < cells.size();
  for (size_t i = 0; sub && i + 1 < g.ranks.size(); i++) {
    const int a = g.ranks[i], b = g.ranks[i + 1];
    if (a < 0 || b < 0 || a >= static_cast<int>(cells.size()) || b >= static_cast<int>(cells.size())) continue;
    const Rect& ra = cells[static_cast<size_t>(a)];
    const Rect& rb = cells[static_cast<size_t>(b)];
    dl->AddLine(edge_toward(ra, rb.center()), edge_toward(rb, ra.center()), with_alpha(kLit, 0.8f), 3.0f);
  }
  for (int r : g.ranks)
    if (r >= 0 && r < static_cast<int>(cells.size()))
      dl->AddRect(cells[static_cast<size_t>(r)].a, cells[static_cast<size_t>(r)].b, kLit, 4.0f, 0, 3.5f);
}

}  // namespace

void draw_mesh_view(const Snapshot& s, ViewContext& ctx) {
  const MeshView& mv = s.mesh;
  const MeshShape& m = mv.shape;
  const MeshGroup& g = mv.group;
  header(s, g);
  const ImVec2 p0 = ImGui::GetCursorScreenPos(), avail = ImGui::GetContentRegionAvail();
  if (m.world() < 1 || avail.x < 80 || avail.y < 80) return;
  ImGui::InvisibleButton("##mesh", avail);
  const bool hovered = ImGui::IsItemHovered();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float fs = ImGui::GetFontSize();
  std::vector<Rect> replicas, stages, tp_boxes;
  // A wide window keeps its right part for the shown rank's slices.
  const float panel_w = avail.x > fs * 60.0f ? std::min(fs * 30.0f, avail.x * 0.4f) : 0.0f;
  const std::vector<Rect> cells = layout(m, p0, ImVec2(avail.x - panel_w, avail.y), replicas, stages, tp_boxes);
  for (int d = 0; d < m.dp; d++) titled_box(dl, replicas[static_cast<size_t>(d)], kBox, kBoxEdge, "dp replica " + std::to_string(d));
  for (int i = 0; i < m.dp * m.pp; i++) {
    const int first = i * m.tp;  // the tp group's lowest rank
    // A dimension of size 1 has no groups to show: its boxes would only nest the ranks deeper.
    if (m.pp > 1) titled_box(dl, stages[static_cast<size_t>(i)], kStageBox, kBoxEdge, "pp stage " + std::to_string(i % m.pp));
    if (m.tp > 1) titled_box(dl, tp_boxes[static_cast<size_t>(i)], kStageBox, kTpEdge, "tp group " + std::to_string(mesh_group_index(m, MeshDim::TP, first)));
  }
  const bool lit = g.valid && static_cast<int>(g.ranks.size()) < m.world();  // a sub-group: dim the rest
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  int hover = -1;
  for (int r = 0; r < m.world(); r++) {
    const Rect& c = cells[static_cast<size_t>(r)];
    const bool member = !lit || std::find(g.ranks.begin(), g.ranks.end(), r) != g.ranks.end();
    const ImU32 fill = rank_color(r, m.world(), member ? 1.0f : 0.35f);
    dl->AddRectFilled(c.a, c.b, fill, 4.0f);
    const MeshCoord k = mesh_coord(m, r);
    const std::string name = "rank " + std::to_string(r), coord = "(" + std::to_string(k.dp) + "," + std::to_string(k.pp) + "," + std::to_string(k.tp) + ")";
    const ImU32 ink = member ? ink_on(fill) : kDim;
    const bool two_lines = c.b.y - c.a.y > fs * 2.4f;
    centered_text(dl, ImVec2(c.center().x, c.center().y - (two_lines ? fs * 0.5f : 0)), ink,
                  ImGui::CalcTextSize(name.c_str()).x < c.b.x - c.a.x ? name : std::to_string(r));
    if (two_lines && ImGui::CalcTextSize(coord.c_str()).x < c.b.x - c.a.x) centered_text(dl, ImVec2(c.center().x, c.center().y + fs * 0.55f), ink, coord);
    if (hovered && c.contains(mouse)) hover = r;
  }
  if (g.valid) draw_group(dl, cells, g);
  if (hover >= 0) dl->AddRect(cells[static_cast<size_t>(hover)].a, cells[static_cast<size_t>(hover)].b, kText, 4.0f, 0, 2.0f);
  // The focus: a rank ringed, or a tp group's box; a click sets it, a second click on it lets go.
  const int focus = s.stepper.focus_rank;
  if (focus >= 0 && focus < m.world()) {
    const Rect& c = cells[static_cast<size_t>(focus)];
    dl->AddRect(ImVec2(c.a.x - 3, c.a.y - 3), ImVec2(c.b.x + 3, c.b.y + 3), IM_COL32(140, 215, 255, 255), 6.0f, 0, 3.0f);
  }
  if (hovered && ImGui::IsMouseClicked(ImGuiMouseButton_Left)) {
    ctx.focus_request = true;
    ctx.focus_rank = -1;
    ctx.focus_group.clear();
    if (hover >= 0) {
      if (hover != focus) ctx.focus_rank = hover;
    } else if (m.tp > 1) {
      for (int i = 0; i < m.dp * m.pp; i++)
        if (tp_boxes[static_cast<size_t>(i)].contains(mouse)) {
          const std::string name = mesh_group_name(m, MeshDim::TP, i * m.tp);
          if (name != s.stepper.focus_group) ctx.focus_group = name;
        }
    }
  }
  float right = p0.x;
  for (const Rect& r : replicas) right = std::max(right, r.b.x);
  if (panel_w > 0) {
    const int shown = hover >= 0 ? hover : g.valid && !g.ranks.empty() ? g.ranks.front() : 0;
    rank_panel(dl, mv, shown, ImVec2(right + fs * 1.5f, p0.y + fs * 0.6f), hover >= 0);
  } else if (hover >= 0) {
    rank_tooltip(mv, hover);
  }
}

}  // namespace dtlab::app
