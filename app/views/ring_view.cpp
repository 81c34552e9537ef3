// The ring view: the collective a paused world is about to step, drawn as ranks on a circle. Each
// rank's buffer is a block of chunk cells colored by how many ranks' contributions they hold; the
// transfers of the pending step travel along their edges as glowing chunks, rendered by the
// ring_chunks GLSL program into a render target (ImDrawList drawing when the program is missing).
// Everything shown comes from Snapshot::collective, which the SnapshotBuilder derives from the trace.
// Three files: the layout solver (ring_layout.h: where nodes and cells go), the GL pass
// (app/gfx/ring_chunk_pass.h: the moving chunks) and, here, the ImGui drawing on both.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "app/gfx/ring_chunk_pass.h"
#include "app/views/ring_layout.h"
#include "app/views/vec2.h"
#include "app/views/views.h"
#include "engine/comm/ring_order.h"  // ring_succ: the ring's direction
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

// Dark text on light fills, white on dark ones.
ImU32 text_on(ImU32 fill) {
  ImVec4 v = ImGui::ColorConvertU32ToFloat4(fill);
  return 0.299f * v.x + 0.587f * v.y + 0.114f * v.z > 0.55f ? IM_COL32(18, 18, 22, 255) : IM_COL32(255, 255, 255, 255);
}

const ImU32 kMissingRed = IM_COL32(235, 70, 60, 255);

// The double binary tree's two trees and the hierarchical all-reduce's inter-node links get their
// own colors, so a learner sees which tree or which kind of link a chunk travels on.
const ImU32 kTreeColor[2] = {IM_COL32(255, 170, 70, 255), IM_COL32(170, 130, 255, 255)};
const ImU32 kInterNodeColor = IM_COL32(235, 90, 160, 255);

ImU32 phase_color(RingPhase p) {
  switch (p) {
    case RingPhase::ReduceScatter:
    case RingPhase::Reduce:
    case RingPhase::Gather: return IM_COL32(255, 170, 70, 255);
    case RingPhase::AllGather:
    case RingPhase::Broadcast: return IM_COL32(90, 200, 235, 255);
    case RingPhase::None: break;
  }
  return ImGui::GetColorU32(ImGuiCol_Text);
}

bool has_glyph(ImWchar c) { return ImGui::GetFont()->FindGlyphNoFallback(c) != nullptr; }

// Ring edges r -> r+1 carry every step of these; the others draw only the transfers of a step.
bool ring_edges(const CollectiveView& cv) {
  return cv.algo == Algorithm::Ring && collective_traits(cv.op).runs(Algorithm::Ring);
}

// One sentence on what the pending step does, for the header.
// Does transfer t cross between nodes (hierarchical all-reduce)?
bool crosses_nodes(const CollectiveView& cv, const StepTransfer& t) {
  const int G = hierarchical_node_size(cv.world, cv.node_size);
  return t.src >= 0 && t.dst >= 0 && t.src / G != t.dst / G;
}

// The captions of the double binary tree, hierarchical and in-network steps; null for the others.
const char* planned_caption(const CollectiveView& cv) {
  const bool up = cv.phase == RingPhase::Reduce || cv.phase == RingPhase::ReduceScatter;
  if (cv.algo == Algorithm::DoubleTree)
    return up ? "two trees, each with half the buffer: partial sums of a chunk move up one level per step, the next chunk right behind"
              : "the roots' final chunks move down both trees, one level per step: each receiver copies";
  if (cv.algo == Algorithm::InNetwork)
    return "each rank sends its next chunk to the switch, which reduces it for everyone, and gets the previous chunk back reduced";
  if (cv.algo != Algorithm::Hierarchical) return nullptr;
  const bool across = std::any_of(cv.pending.begin(), cv.pending.end(), [&](const StepTransfer& t) { return crosses_nodes(cv, t); });
  if (across)
    return up ? "across nodes, the ranks holding the same shard reduce-scatter it: only this shard's pieces cross the network"
              : "across nodes, the same-shard ranks pass the finished pieces on round their ring";
  return up ? "inside each node a ring reduce-scatter: every rank adds its neighbour's shard over the fast links"
            : "inside each node a ring all-gather: the finished shards go round the node";
}

const char* step_caption(const CollectiveView& cv) {
  if (cv.steps == 0) return "a single rank has nothing to exchange: the collective returns at once";
  if (cv.pending.empty())
    return cv.op == CollectiveOp::Reduce ? "done: the root holds the result; the other ranks' buffers are unchanged"
                                         : "done: every rank holds its result";
  if (const char* c = planned_caption(cv)) return c;
  switch (cv.phase) {
    case RingPhase::ReduceScatter: return "each rank sends one chunk to the next rank, which adds its own part to it";
    case RingPhase::AllGather: return "each rank forwards a finished chunk to the next rank, which copies it";
    case RingPhase::Reduce: return "partial sums move up the tree: each receiver adds what it gets";
    case RingPhase::Broadcast:
      return cv.algo == Algorithm::Naive ? "the result goes out to one rank per step, which copies it"
                                         : "the result moves down the tree: each receiver copies it";
    case RingPhase::Gather: return "one rank's buffer per step goes to the root, which adds it";
    case RingPhase::None: break;
  }
  return "each rank sends a different chunk to each other rank";
}

// ---- edges: quadratic curves bulging outwards, trimmed at the node borders ------------------------

struct RingCurve {
  ImVec2 a, ctrl, b;
  float t0 = 0, t1 = 1;  // where the curve leaves the source node and reaches the destination's
  ImVec2 at(float t) const {
    const float u = 1 - t;
    return a * (u * u) + ctrl * (2 * u * t) + b * (t * t);
  }
};

// Two ranks share one spoke through the ring's center; their edges bulge this much (of the spoke's
// length, so half of it in radii at the middle) to each side.
constexpr float kTwoRankBulge = 0.22f;

RingCurve make_curve(ImVec2 a, ImVec2 b, float bulge, float trim_a, float trim_b) {
  RingCurve c;
  c.a = a;
  c.b = b;
  const ImVec2 d = b - a;
  c.ctrl = (a + b) * 0.5f + ImVec2(d.y, -d.x) * bulge;  // left of a -> b: outwards on a clockwise ring
  constexpr int kSamples = 64;
  c.t0 = 0;
  c.t1 = 1;
  for (int i = 0; i <= kSamples; i++) {
    const float t = static_cast<float>(i) / kSamples;
    if (length(c.at(t) - a) >= trim_a) {
      c.t0 = t;
      break;
    }
  }
  for (int i = kSamples; i >= 0; i--) {
    const float t = static_cast<float>(i) / kSamples;
    if (length(c.at(t) - b) >= trim_b) {
      c.t1 = t;
      break;
    }
  }
  if (c.t1 < c.t0) c.t1 = c.t0;
  return c;
}

void draw_curve(ImDrawList* dl, const RingCurve& c, ImU32 col, float thick, float arrow, bool dashed) {
  constexpr int kSeg = 20;
  // The line stops where the arrow head begins.
  float t_end = c.t1;
  if (arrow > 0) {
    for (int i = kSeg; i >= 0; i--) {
      const float t = c.t0 + (c.t1 - c.t0) * static_cast<float>(i) / kSeg;
      if (length(c.at(t) - c.at(c.t1)) >= arrow * 0.8f) {
        t_end = t;
        break;
      }
    }
  }
  if (dashed) {
    for (int i = 0; i < kSeg; i += 2) {
      const float ta = c.t0 + (t_end - c.t0) * static_cast<float>(i) / kSeg;
      const float tb = c.t0 + (t_end - c.t0) * static_cast<float>(i + 1) / kSeg;
      dl->AddLine(c.at(ta), c.at(tb), col, thick);
    }
  } else {
    for (int i = 0; i <= kSeg; i++) dl->PathLineTo(c.at(c.t0 + (t_end - c.t0) * static_cast<float>(i) / kSeg));
    dl->PathStroke(col, 0, thick);
  }
  if (arrow > 0) {
    const ImVec2 tip = c.at(c.t1);
    ImVec2 dir = tip - c.at(t_end);
    const float len = std::max(length(dir), 1e-3f);
    dir = dir * (1.0f / len);
    const ImVec2 perp(-dir.y, dir.x);
    const ImVec2 base = tip - dir * arrow;
    dl->AddTriangleFilled(tip, base + perp * (arrow * 0.5f), base - perp * (arrow * 0.5f), col);
  }
}

void dashed_circle(ImDrawList* dl, ImVec2 c, float r, ImU32 col, float thick, int dashes, float spin) {
  for (int i = 0; i < dashes; i++) {
    const float a0 = spin + 2 * kPi * static_cast<float>(i) / static_cast<float>(dashes);
    dl->PathArcTo(c, r, a0, a0 + kPi / static_cast<float>(dashes), 6);
    dl->PathStroke(col, 0, thick);
  }
}

void draw_check(ImDrawList* dl, ImVec2 p0, float w, float h, ImU32 col) {
  const float s = std::min(w, h);
  const ImVec2 o(p0.x + (w - s) * 0.5f, p0.y + (h - s) * 0.5f);
  dl->PathLineTo(o + ImVec2(0.22f * s, 0.52f * s));
  dl->PathLineTo(o + ImVec2(0.42f * s, 0.72f * s));
  dl->PathLineTo(o + ImVec2(0.78f * s, 0.30f * s));
  dl->PathStroke(col, 0, std::max(1.5f, s * 0.13f));
}

// Text centered on `c` at `size` pixels.
void centered_label(ImDrawList* dl, float size, ImVec2 c, ImU32 col, const char* text) {
  ImFont* font = ImGui::GetFont();
  const ImVec2 ts = font->CalcTextSizeA(size, FLT_MAX, 0.0f, text);
  dl->AddText(font, size, ImVec2(std::floor(c.x - ts.x * 0.5f), std::floor(c.y - ts.y * 0.5f)), col, text);
}

// ---- moving chunks ---------------------------------------------------------------------------------

struct Chunk {
  const StepTransfer* t;
  ImVec2 pos;
  float half;
  int held;
  ImU32 color;
};

// The same look with the draw list: a fading streak, layered translucent squares for the glow.
void draw_sprites_fallback(ImDrawList* dl, const std::vector<Sprite>& sprites) {
  for (const Sprite& s : sprites) {
    const ImU32 base = ImGui::ColorConvertFloat4ToU32(ImVec4(s.color.x, s.color.y, s.color.z, 1.0f));
    constexpr int kStreak = 6;
    for (int i = 0; i < kStreak; i++) {
      const float a = static_cast<float>(i) / kStreak, b = static_cast<float>(i + 1) / kStreak;
      dl->AddLine(s.pos - s.dir * (s.tail * a), s.pos - s.dir * (s.tail * b), with_alpha(base, 0.5f * (1 - a) * (1 - a) * s.color.w),
                  s.half * (1.3f - a));
    }
    for (int k = 3; k >= 1; k--) {
      const float g = s.half * (1.0f + 0.35f * static_cast<float>(k));
      dl->AddRectFilled(s.pos - ImVec2(g, g), s.pos + ImVec2(g, g), with_alpha(base, 0.12f * s.color.w), g * 0.8f);
    }
    dl->AddRectFilled(s.pos - ImVec2(s.half, s.half), s.pos + ImVec2(s.half, s.half), with_alpha(base, s.color.w), s.half * 0.38f);
    dl->AddRect(s.pos - ImVec2(s.half, s.half), s.pos + ImVec2(s.half, s.half), with_alpha(IM_COL32(0, 0, 0, 110), s.color.w),
                s.half * 0.38f, 0, std::max(1.0f, s.half * 0.15f));
  }
}

// ---- pieces of the view ----------------------------------------------------------------------------

// A process group's collective is drawn on a ring of its members: node r is global rank
// members[r], colored as that rank is everywhere else.
int global_rank(const CollectiveView& cv, int r) {
  return cv.members.empty() || r < 0 || r >= static_cast<int>(cv.members.size()) ? r : cv.members[static_cast<size_t>(r)];
}
ImU32 node_color(const CollectiveView& cv, int r, float alpha = 1.0f) {
  return cv.members.empty() ? rank_color(r, cv.world, alpha) : rank_color(global_rank(cv, r), cv.world_size, alpha);
}

void rank_list(const std::vector<int>& ranks, int world, ImU32 fallback) {
  if (ranks.empty()) {
    ImGui::SameLine(0, ImGui::GetFontSize() * 0.35f);
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(fallback), "none");
    return;
  }
  for (size_t i = 0; i < ranks.size(); i++) {
    ImGui::SameLine(0, ImGui::GetFontSize() * 0.35f);
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(rank_color(ranks[i], world)), "%d", ranks[i]);
  }
}

void draw_header(const CollectiveView& cv, bool presentation) {
  const float sp = ImGui::GetFontSize() * 0.9f;
  const ImVec4 dim = ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled);
  // The next item on this line when it fits, else on the next: a narrow tile (presentation's large
  // type) wraps the header instead of cutting "phase: reduce-scatter" off at the edge.
  auto next = [&](const char* text) {
    flow(ImGui::CalcTextSize(text).x, sp);
  };
  ImGui::TextColored(ImVec4(1.0f, 0.85f, 0.45f, 1.0f), "%s", collective_name(cv.op));
  ImGui::SameLine(0, ImGui::GetFontSize() * 0.35f);
  ImGui::TextColored(dim, "%s #%llu", cv.group != 0 ? cv.group_name.c_str() : "world", static_cast<unsigned long long>(cv.seq));
  const std::string algo = std::string("algorithm ") + algorithm_name(cv.algo);
  next(algo.c_str());
  ImGui::TextColored(dim, "algorithm");
  ImGui::SameLine();
  ImGui::TextUnformatted(algorithm_name(cv.algo));
  const std::string bytes = human_bytes(cv.bytes);
  next(bytes.c_str());
  ImGui::TextUnformatted(bytes.c_str());
  if (cv.steps == 0) {
    next("no steps: one rank");
    ImGui::TextColored(dim, "no steps: one rank");
  } else {
    if (cv.phase != RingPhase::None) {  // an all-to-all or a broadcast has no phases: no "phase: none"
      const std::string phase = std::string("phase: ") + ring_phase_name(cv.phase);
      next(phase.c_str());
      ImGui::TextColored(dim, "phase:");
      ImGui::SameLine();
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(phase_color(cv.phase)), "%s", ring_phase_name(cv.phase));
    }
    char step[64];
    if (cv.schematic_step >= 0) std::snprintf(step, sizeof step, "step %d of %d (schematic)", cv.schematic_step + 1, cv.steps);
    else if (cv.steps_done < cv.steps) std::snprintf(step, sizeof step, "step %d of %d", cv.steps_done + 1, cv.steps);
    else std::snprintf(step, sizeof step, "done (%d steps)", cv.steps);
    next(step);
    if (cv.schematic_step >= 0) ImGui::TextColored(dim, "%s", step);
    else if (cv.steps_done < cv.steps) ImGui::TextUnformatted(step);
    else ImGui::TextColored(ImVec4(0.45f, 0.85f, 0.45f, 1.0f), "%s", step);
  }
  ImGui::PushTextWrapPos(0.0f);
  if (cv.opaque)
    ImGui::TextColored(dim, "NCCL runs this collective inside one kernel: dtlab steps it whole. The arrows show "
                            "the algorithm's order (NCCL's ring), not observed steps.");
  if (!cv.label.empty()) {
    next(cv.label.c_str());
    ImGui::TextColored(ImVec4(0.75f, 0.65f, 1.0f, 1.0f), "%s", cv.label.c_str());
  }
  ImGui::PopTextWrapPos();
  if (cv.group != 0) {  // the group and its members; the ranks outside it take no part: listed, dimmed
    std::string others;
    for (int r = 0; r < cv.world_size; r++)
      if (std::find(cv.members.begin(), cv.members.end(), r) == cv.members.end()) others += (others.empty() ? "" : " ") + std::to_string(r);
    ImGui::TextColored(ImVec4(0.75f, 0.65f, 1.0f, 1.0f), "process group %s:", cv.group_name.c_str());
    ImGui::SameLine(0, ImGui::GetFontSize() * 0.35f);
    ImGui::TextColored(dim, "ranks");
    rank_list(cv.members, cv.world_size, ImGui::GetColorU32(ImGuiCol_TextDisabled));
    if (!others.empty()) {
      ImGui::SameLine(0, sp);
      ImGui::TextColored(dim, "(ranks %s are not in it)", others.c_str());
    }
  }
  if (cv.in_flight && !cv.missing.empty()) {
    ImGui::TextColored(dim, "arrived:");
    rank_list(cv.arrived, cv.world, ImGui::GetColorU32(ImGuiCol_TextDisabled));
    ImGui::SameLine(0, sp);
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kMissingRed), "waiting for rank%s", cv.missing.size() > 1 ? "s" : "");
    rank_list(cv.missing, cv.world, kMissingRed);
  }
  if (presentation) return;  // fewer words: the picture and the centre's phase say it
  ImGui::PushStyleColor(ImGuiCol_Text, dim);
  ImGui::TextWrapped("%s", step_caption(cv));
  ImGui::PopStyleColor();
}

const char* moves_next_text(bool ring) { return ring ? "moves next (number: chunk index)" : "moves next"; }

// Whether the legend's two parts (the contribution scale, the moving chunk) fit on one line `width` wide.
// The contribution scale's width with its long or short label ("held:", for a narrow canvas).
float legend_scale_width(int world, float fs, bool short_label) {
  ImFont* font = ImGui::GetFont();
  char buf[48];
  std::snprintf(buf, sizeof buf, "0 .. %d (final)", world);
  const float sw = fs * 0.8f;
  return font->CalcTextSizeA(fs, FLT_MAX, 0.0f, short_label ? "held:" : "contributions held:").x + static_cast<float>(world + 1) * (sw + 2.0f) +
         font->CalcTextSizeA(fs, FLT_MAX, 0.0f, buf).x + fs * 1.1f;
}

bool legend_one_line(int world, float fs, bool ring, float width) {
  const float sw = fs * 0.8f;
  return legend_scale_width(world, fs, false) + sw + ImGui::GetFont()->CalcTextSizeA(fs, FLT_MAX, 0.0f, moves_next_text(ring)).x + fs * 1.3f <=
         width;
}

// Legend along the bottom of the canvas: the contribution scale and the moving chunk, on a second
// line when the canvas is narrower than both.
void draw_legend(ImDrawList* dl, ImVec2 p, int world, float fs, bool ring, bool one_line, float width) {
  ImFont* font = ImGui::GetFont();
  const float x0 = p.x;
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_TextDisabled);
  const float sw = fs * 0.8f;
  auto label = [&](const char* s) {
    dl->AddText(font, fs, ImVec2(p.x, p.y + (sw - fs) * 0.5f), text, s);
    p.x += font->CalcTextSizeA(fs, FLT_MAX, 0.0f, s).x + fs * 0.3f;
  };
  label(legend_scale_width(world, fs, false) <= width ? "contributions held:" : "held:");
  for (int h = 0; h <= world; h++) {
    const ImU32 c = h == 0 ? ImGui::GetColorU32(ImGuiCol_FrameBg) : contribution_color(h, world);
    dl->AddRectFilled(p, p + ImVec2(sw, sw), c, sw * 0.2f);
    if (h == 0) dl->AddRect(p, p + ImVec2(sw, sw), ImGui::GetColorU32(ImGuiCol_Border), sw * 0.2f);
    if (h == world) draw_check(dl, p, sw, sw, text_on(c));
    p.x += sw + 2.0f;
  }
  p.x += fs * 0.2f;
  char buf[48];
  std::snprintf(buf, sizeof buf, "0 .. %d (final)", world);
  label(buf);
  p.x += fs * 0.6f;
  if (!one_line) p = ImVec2(x0, p.y + fs * 1.2f);
  const ImU32 chunk = contribution_color(std::max(1, world / 2), world);
  dl->AddRectFilled(p, p + ImVec2(sw, sw), chunk, sw * 0.38f);
  p.x += sw + fs * 0.3f;
  label(moves_next_text(ring));
}

// What the colors of the double binary tree's and the hierarchical all-reduce's edges mean.
void draw_algorithm_key(ImDrawList* dl, ImVec2 p, const CollectiveView& cv, float fs) {
  struct Entry {
    ImU32 color;
    const char* text;
  };
  std::vector<Entry> entries;
  if (cv.algo == Algorithm::DoubleTree)
    entries = {{kTreeColor[0], "tree 0 (root 0): first half"}, {kTreeColor[1], "tree 1: second half"}};
  if (cv.algo == Algorithm::Hierarchical && hierarchical_node_size(cv.world, cv.node_size) < cv.world)
    entries = {{phase_color(RingPhase::ReduceScatter), "inside a node"}, {kInterNodeColor, "across nodes"}};
  for (const Entry& e : entries) {
    dl->AddLine(p + ImVec2(0, fs * 0.5f), p + ImVec2(fs * 1.2f, fs * 0.5f), e.color, std::max(2.0f, fs * 0.15f));
    dl->AddText(p + ImVec2(fs * 1.5f, 0), ImGui::GetColorU32(ImGuiCol_TextDisabled), e.text);
    p.y += fs * 1.2f;
  }
}

// Node r of the ring, labelled with its global rank `label`.
void draw_node(ImDrawList* dl, const RingLayout& L, int r, int label, float fs, ImU32 fill, bool outline_red, double time) {
  const ImVec2 c = L.node[static_cast<size_t>(r)];
  // An opaque disc first: a dimmed node hides the ring behind it, and its label contrasts with
  // the color actually shown.
  const ImVec4 bg = ImGui::GetStyleColorVec4(ImGuiCol_WindowBg), f = ImGui::ColorConvertU32ToFloat4(fill);
  const ImU32 shown = ImGui::ColorConvertFloat4ToU32(ImVec4(bg.x + (f.x - bg.x) * f.w, bg.y + (f.y - bg.y) * f.w, bg.z + (f.z - bg.z) * f.w, 1.0f));
  dl->AddCircleFilled(c, L.node_r, shown, 0);
  dl->AddCircle(c, L.node_r, IM_COL32(0, 0, 0, 140), 0, std::max(1.0f, fs * 0.08f));
  if (outline_red)
    dashed_circle(dl, c, L.node_r + std::max(3.0f, fs * 0.22f), kMissingRed, std::max(2.0f, fs * 0.16f), 10,
                  static_cast<float>(std::fmod(time * 0.8, 2.0 * kPi)));
  char buf[16];
  std::snprintf(buf, sizeof buf, "%d", label);
  const float size = std::clamp(L.node_r * 1.15f, fs * 0.6f, fs * 1.5f);
  centered_label(dl, size, c, text_on(shown), buf);
}

// One rank's buffer: chunk cells with their contribution counts.
void draw_cells(ImDrawList* dl, const RingLayout& L, const CollectiveView& cv, int r, float fs) {
  const int N = cv.world;
  const auto& row = cv.cells[static_cast<size_t>(r)];
  ImFont* font = ImGui::GetFont();
  // The count is what tells 1 from 2 contributions apart at 8 ranks and more (neighbouring shades
  // differ by a sixth of the ramp), so it shows down to 10-pixel digits, also under presentation's
  // large font.
  const float tsize = std::min(fs * 0.85f, L.cell * 0.66f);
  const bool text = tsize >= std::min(fs * 0.65f, 10.0f);
  // Rounded corners only where they show: square cells cost a quarter of the vertices at 16 ranks.
  const float round = L.cell >= fs * 1.4f ? L.cell * 0.18f : 0.0f;
  for (int c = 0; c < cv.chunks && c < static_cast<int>(row.size()); c++) {
    const ImVec2 p0 = cell_pos(L, r, c), p1 = p0 + ImVec2(L.cell, L.cell);
    const int held = row[static_cast<size_t>(c)];
    if (held <= 0) {
      dl->AddRectFilled(p0, p1, ImGui::GetColorU32(ImGuiCol_FrameBg), round);
      dl->AddRect(p0, p1, ImGui::GetColorU32(ImGuiCol_Border), round);
      continue;
    }
    const ImU32 fill = contribution_color(held, N);
    dl->AddRectFilled(p0, p1, fill, round);
    if (held >= N) {
      draw_check(dl, p0, L.cell, L.cell, text_on(fill));
    } else if (text) {
      // A count of contributions ("2": two ranks' values summed here), never "2/4", which reads as
      // a fraction of the data.
      char buf[32];
      std::snprintf(buf, sizeof buf, "%d", held);
      if (font->CalcTextSizeA(tsize, FLT_MAX, 0.0f, buf).x <= L.cell - 2.0f)
        centered_label(dl, tsize, (p0 + p1) * 0.5f, text_on(fill), buf);
    }
  }
}

// Rectangle in which the chunk cell of (rank, chunk) lies; chunk -1 (tree/naive) is the whole buffer.
bool cell_rect(const RingLayout& L, const CollectiveView& cv, int r, int chunk, ImVec2& p0, ImVec2& p1) {
  if (!L.cells || r < 0 || r >= cv.world) return false;
  const int c = chunk < 0 ? 0 : chunk;
  if (c >= cv.chunks) return false;
  p0 = cell_pos(L, r, c);
  p1 = p0 + ImVec2(L.cell, L.cell);
  return true;
}

void node_tooltip(const Snapshot& s, const CollectiveView& cv, int r) {
  ImGui::BeginTooltip();
  const int g = global_rank(cv, r);
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(node_color(cv, r)), "rank %d", g);
  if (cv.group != 0) ImGui::Text("rank %d of %s", r, cv.group_name.c_str());
  if (g < static_cast<int>(s.compute_activity.size())) ImGui::Text("compute: %s", s.compute_activity[static_cast<size_t>(g)].c_str());
  if (g < static_cast<int>(s.comm_activity.size())) ImGui::Text("comm:    %s", s.comm_activity[static_cast<size_t>(g)].c_str());
  if (cv.valid && r < static_cast<int>(cv.rank_steps_done.size()))
    ImGui::Text("steps finished: %d of %d", cv.rank_steps_done[static_cast<size_t>(r)], cv.steps);
  if (cv.valid && r < static_cast<int>(cv.cells.size())) {
    std::string cells;
    for (int h : cv.cells[static_cast<size_t>(r)]) cells += (cells.empty() ? "" : " ") + std::to_string(h);
    ImGui::Text("contributions per chunk: %s", cells.c_str());
  }
  ImGui::EndTooltip();
}

// No collective yet: a hint in the ring's middle (below the node when the world is one rank).
void draw_hint(ImDrawList* dl, const RingLayout& L, int N, float room, float width, float fs) {
  const char* dash = has_glyph(0x2014) ? " \u2014 " : " - ";
  const std::string hint = std::string("No collective yet") + dash + "press C (next collective) or Space (run)";
  const float wrap = std::max(fs * 8, std::min(room, width - fs));
  ImFont* font = ImGui::GetFont();
  const ImVec2 ts = font->CalcTextSizeA(fs, FLT_MAX, wrap, hint.c_str());
  const float y = N > 1 ? L.center.y : L.center.y + L.node_r + fs * 1.2f + ts.y * 0.5f;
  const ImVec2 tp(std::floor(L.center.x - ts.x * 0.5f), std::floor(y - ts.y * 0.5f));
  dl->AddRectFilled(tp - ImVec2(fs * 0.6f, fs * 0.4f), tp + ts + ImVec2(fs * 0.6f, fs * 0.4f),
                    ImGui::GetColorU32(ImGuiCol_PopupBg, 0.92f), fs * 0.4f);
  dl->AddText(font, fs, tp, ImGui::GetColorU32(ImGuiCol_Text), hint.c_str(), nullptr, wrap);
}

// The step counter, the phase, and who the world waits for (or the wall time once done). `aside`: the
// middle of the ring is taken by edges crossing it (two ranks: their spoke runs through the center,
// bulging `aside` x the radius to each side), so the block sits left of them inside the ring where it
// fits, else left of the ring (the view's left edge at `left`).
void draw_step_counter(ImDrawList* dl, const RingLayout& L, const CollectiveView& cv, float room, float fs, float dy, float aside,
                       float left) {
  char big[32];
  if (cv.steps_done < cv.steps) std::snprintf(big, sizeof big, "step %d/%d", cv.steps_done + 1, cv.steps);
  else std::snprintf(big, sizeof big, "done");
  float bs = std::min(fs * 1.6f, room / 6.0f);
  if (bs < fs * 0.8f && aside <= 0) return;
  // Lines of the center block, on a translucent plate so edges crossing it stay out of the way.
  struct Line {
    std::string text;
    float size;
    ImU32 color;
  };
  std::vector<Line> lines = {{big, bs, ImGui::GetColorU32(ImGuiCol_Text)}};
  if (cv.phase != RingPhase::None) lines.push_back({ring_phase_name(cv.phase), fs, phase_color(cv.phase)});
  if (cv.in_flight && !cv.missing.empty()) {
    std::string w = "waiting for rank";
    if (cv.missing.size() > 1) w += "s";
    for (size_t i = 0; i < cv.missing.size(); i++) w += (i ? ", " : " ") + std::to_string(cv.missing[i]);
    lines.push_back({w, fs, kMissingRed});
  } else if (cv.steps_done >= cv.steps && cv.measured_s >= 0) {
    char ms[48];
    std::snprintf(ms, sizeof ms, "%.3f ms wall", cv.measured_s * 1e3);
    lines.push_back({ms, fs, ImGui::GetColorU32(ImGuiCol_TextDisabled)});
  }
  ImFont* font = ImGui::GetFont();
  float w = 0, h = 0;
  auto measure = [&] {
    w = h = 0;
    for (const Line& l : lines) {
      w = std::max(w, font->CalcTextSizeA(l.size, FLT_MAX, 0.0f, l.text.c_str()).x);
      h += l.size;
    }
  };
  measure();
  const ImVec2 m(fs * 0.5f, fs * 0.25f);
  float x = L.center.x;
  if (aside > 0) {
    const float inside = aside * L.radius + fs * 0.6f + m.x + w * 0.5f;  // clear of the edges and their arrowheads
    if (bs >= fs * 0.8f && inside + w * 0.5f + m.x <= L.radius - fs * 0.3f) {
      x -= inside;
    } else {  // left of the ring, at full size
      lines[0].size = bs = fs * 1.6f;
      measure();
      const float beyond = L.radius + fs + m.x + w * 0.5f;  // clear of the ring
      if (L.center.x - beyond - w * 0.5f - m.x < left) return;
      x -= beyond;
    }
  }
  ImVec2 p(x, L.center.y - h * 0.5f + dy);
  dl->AddRectFilled(ImVec2(p.x - w * 0.5f - m.x, p.y - m.y), ImVec2(p.x + w * 0.5f + m.x, p.y + h + m.y),
                    ImGui::GetColorU32(ImGuiCol_WindowBg, 0.8f), fs * 0.4f);
  for (const Line& l : lines) {
    centered_label(dl, l.size, ImVec2(p.x, p.y + l.size * 0.5f), l.color, l.text.c_str());
    p.y += l.size;
  }
}

// The edges between nodes: curves bulging outwards, trimmed at the node borders. Transfers to or
// from the in-network switch run straight between the rank and the switch in the ring's middle.
struct Edges {
  const RingLayout& L;
  float bulge, trim;
  float hub_trim = 0;  // the switch's half side (in-network all-reduce), else 0
  RingCurve of(int a, int b) const {
    const bool hub = a == kNetworkSwitch || b == kNetworkSwitch;
    auto at = [&](int r) { return r == kNetworkSwitch ? L.center : L.node[static_cast<size_t>(r)]; };
    // Up and down bulge to opposite sides, so a step's two transfers on one spoke stay apart.
    return make_curve(at(a), at(b), hub ? 0.06f : bulge, a == kNetworkSwitch ? hub_trim : trim, b == kNetworkSwitch ? hub_trim : trim);
  }
};

bool in_world(const StepTransfer& t, int N) {
  auto end = [&](int r) { return r == kNetworkSwitch || (r >= 0 && r < N); };
  return end(t.src) && end(t.dst) && (t.src >= 0 || t.dst >= 0);
}

ImU32 transfer_color(const CollectiveView& cv, const StepTransfer& t) {
  if (cv.algo == Algorithm::DoubleTree && t.chunk >= 0) return kTreeColor[t.chunk / kPipelineChunks % 2];
  if (cv.algo == Algorithm::Hierarchical && crosses_nodes(cv, t)) return kInterNodeColor;
  return phase_color(t.phase);
}

// Every edge of both trees, faint, under the step's transfers: the trees' shape.
void draw_tree_structure(ImDrawList* dl, const Edges& edges, int N, float thick) {
  for (int tree = 0; tree < 2; tree++)
    for (int r = 0; r < N; r++) {
      const int p = double_tree_links(N, tree, r).parent;
      if (p >= 0) draw_curve(dl, edges.of(p, r), with_alpha(kTreeColor[tree], 0.3f), thick * 0.8f, 0.0f, false);
    }
}

// Hierarchical all-reduce: each node's ranks (consecutive on the ring) under one band, labeled.
void draw_node_groups(ImDrawList* dl, const RingLayout& L, const CollectiveView& cv, float fs) {
  const int N = cv.world, G = hierarchical_node_size(N, cv.node_size);
  if (G >= N || N % G != 0) return;
  const float step = 2 * kPi / static_cast<float>(N);
  for (int m = 0; m < N / G; m++) {
    const float a0 = -kPi / 2 + step * (static_cast<float>(m * G) - 0.42f), a1 = -kPi / 2 + step * (static_cast<float>(m * G + G - 1) + 0.42f);
    dl->PathArcTo(L.center, L.radius, a0, a1, 24);
    dl->PathStroke(ImGui::GetColorU32(ImGuiCol_Text, 0.1f), 0, L.node_r * 2.9f);
    const float am = (a0 + a1) * 0.5f, rr = L.radius - L.node_r * 2.2f;
    char buf[24];
    std::snprintf(buf, sizeof buf, "node %d", m);
    centered_label(dl, fs, L.center + ImVec2(std::cos(am), std::sin(am)) * rr, ImGui::GetColorU32(ImGuiCol_TextDisabled), buf);
  }
}

// In-network all-reduce: the switch that reduces, a box in the ring's middle.
void draw_switch(ImDrawList* dl, ImVec2 c, float half, float fs, bool busy) {
  const ImVec2 h(half * 1.5f, half);
  dl->AddRectFilled(c - h, c + h, ImGui::GetColorU32(ImGuiCol_FrameBg), half * 0.25f);
  dl->AddRect(c - h, c + h, busy ? phase_color(RingPhase::Reduce) : ImGui::GetColorU32(ImGuiCol_Border), half * 0.25f, 0,
              std::max(1.5f, fs * 0.12f));
  centered_label(dl, std::min(fs, half * 0.9f), c, ImGui::GetColorU32(ImGuiCol_Text), "switch");
}

void draw_edges(ImDrawList* dl, const Edges& edges, const CollectiveView& cv, int N, bool ring, float fs) {
  const float thick = std::max(1.5f, fs * 0.12f), arrow = std::max(7.0f, fs * 0.7f);
  const ImU32 edge_active = ImGui::GetColorU32(ImGuiCol_Text, 0.75f);
  const ImU32 edge_idle = ImGui::GetColorU32(ImGuiCol_Text, 0.28f);
  if (ring) {
    for (int r = 0; r < N; r++)
      draw_curve(dl, edges.of(r, ring_succ(r, N)), cv.pending.empty() ? edge_idle : edge_active, thick, arrow, false);
    return;
  }
  if (cv.algo == Algorithm::DoubleTree) draw_tree_structure(dl, edges, N, thick);
  for (const StepTransfer& t : cv.last)
    if (in_world(t, N)) draw_curve(dl, edges.of(t.src, t.dst), edge_idle, thick * 0.8f, arrow * 0.8f, true);
  for (const StepTransfer& t : cv.pending)
    if (in_world(t, N)) draw_curve(dl, edges.of(t.src, t.dst), with_alpha(transfer_color(cv, t), 0.9f), thick * 1.3f, arrow, false);
}

// What moves next, mid-edge: a chunk per pending transfer whose receiver has not taken it yet.
std::vector<Chunk> pending_chunks(const Edges& edges, const CollectiveView& cv, int N, float phase, float half) {
  std::vector<Chunk> chunks;
  for (const StepTransfer& t : cv.pending) {
    if (!in_world(t, N)) continue;
    if (t.dst >= 0 && t.dst < static_cast<int>(cv.rank_steps_done.size()) &&
        cv.rank_steps_done[static_cast<size_t>(t.dst)] > cv.steps_done)
      continue;
    const int c = fine_chunks(t, cv.chunks).first;
    int held = N;  // the switch sends back final chunks
    if (t.src >= 0) {
      const auto& src_cells = cv.cells[static_cast<size_t>(t.src)];
      held = c < static_cast<int>(src_cells.size()) ? src_cells[static_cast<size_t>(c)] : N;
    }
    if (t.phase == RingPhase::AllGather || t.phase == RingPhase::Broadcast || held <= 0) held = N;
    const RingCurve cu = edges.of(t.src, t.dst);
    chunks.push_back({&t, cu.at(cu.t0 + (cu.t1 - cu.t0) * phase), half, held, contribution_color(held, N)});
  }
  return chunks;
}

}  // namespace

// The ring view's state between frames: the searched layout, and the chunk sprites' render pass
// (its buffers live as long as the GL context, the app's).
struct RingViewState::Impl {
  RingLayoutCache layout;
  ChunkPass pass;
  std::vector<Placed> placed;  // where each sprite's square of the target goes on screen
};
RingViewState::RingViewState() : impl(std::make_unique<Impl>()) {}
RingViewState::~RingViewState() = default;

namespace {

// Sprites: each chunk with a streak behind it, as long as the way it came (at most 4 half sides),
// rendered by the ring_chunks program, else with the draw list.
void draw_chunk_sprites(ImDrawList* dl, const Edges& edges, const std::vector<Chunk>& chunks, float phase, float half,
                        ViewContext& ctx, RingViewState::Impl& st) {
  std::vector<Sprite> sprites;
  for (const Chunk& ch : chunks) {
    const RingCurve cu = edges.of(ch.t->src, ch.t->dst);
    const float t = cu.t0 + (cu.t1 - cu.t0) * phase;
    ImVec2 dir = cu.at(std::min(1.0f, t + 0.01f)) - cu.at(std::max(0.0f, t - 0.01f));
    dir = dir * (1.0f / std::max(length(dir), 1e-4f));
    const float tail = std::min(half * 4.0f, length(ch.pos - cu.at(cu.t0)));
    sprites.push_back({ch.pos, half, ImGui::ColorConvertU32ToFloat4(ch.color), dir, tail});
  }
  if (sprites.empty()) return;
  const ShaderProgram* prog = ctx.gl ? ctx.gl->program("ring_chunks") : nullptr;
  unsigned tex = 0;
  if (prog) {
    const float scale = std::max(1.0f, ImGui::GetIO().DisplayFramebufferScale.x);
    tex = st.pass.render(*ctx.gl, *prog, scale, sprites, static_cast<float>(ctx.time), st.placed);
  }
  if (tex) {
    // The target's texture is stored premultiplied; rows start at the bottom, hence the flipped v.
    dl->AddCallback(premultiplied_blend, nullptr);
    for (const Placed& pl : st.placed)
      dl->AddImage(reinterpret_cast<ImTextureID>(static_cast<intptr_t>(tex)), pl.screen0, pl.screen1, pl.uv0, pl.uv1);
    dl->AddCallback(ImDrawCallback_ResetRenderState, nullptr);
  } else {
    draw_sprites_fallback(dl, sprites);
  }
}

// Nodes, their buffers, the cells a chunk leaves and lands in, and the labels on the chunks.
void draw_nodes(ImDrawList* dl, const RingLayout& L, const CollectiveView& cv, int N, bool valid, const std::vector<Chunk>& chunks,
                float fs, double time) {
  for (int r = 0; r < N; r++) {
    const bool missing = valid && cv.in_flight && std::find(cv.missing.begin(), cv.missing.end(), r) != cv.missing.end();
    const ImU32 fill = node_color(cv, r, valid && !missing ? 1.0f : 0.45f);
    draw_node(dl, L, r, valid ? global_rank(cv, r) : r, fs, fill, missing, time);
    if (valid && L.cells) draw_cells(dl, L, cv, r, fs);
  }
  if (valid && L.cells) {
    const float t = std::max(1.5f, fs * 0.12f);
    for (const Chunk& ch : chunks) {
      const auto [lo, hi] = ch.t->chunk < 0 ? std::pair<int, int>{-1, 0} : fine_chunks(*ch.t, cv.chunks);
      for (int c = lo; c < hi; c++) {  // a chunk may span several cells (hierarchical's shards)
        ImVec2 a0, a1;
        if (cell_rect(L, cv, ch.t->src, c, a0, a1))
          dl->AddRect(a0 - ImVec2(t, t), a1 + ImVec2(t, t), ImGui::GetColorU32(ImGuiCol_Text), L.cell * 0.2f, 0, t);
        if (cell_rect(L, cv, ch.t->dst, c, a0, a1))
          dl->AddRect(a0 - ImVec2(t, t), a1 + ImVec2(t, t), ImGui::GetColorU32(ImGuiCol_Text, 0.45f), L.cell * 0.2f, 0, t * 0.7f);
      }
    }
  }
  for (const Chunk& ch : chunks) {
    if (ch.t->chunk < 0 || ch.half * 2 < fs * 0.7f) continue;
    char buf[16];
    std::snprintf(buf, sizeof buf, "%d", ch.t->chunk);
    centered_label(dl, std::min(fs, ch.half * 1.45f), ch.pos, text_on(ch.color), buf);
  }
}

// A cell's tooltip when the mouse is on one of rank r's cells; false when it is not.
bool cell_tooltip(const RingLayout& L, const CollectiveView& cv, int r, int N, ImVec2 mouse) {
  for (int c = 0; c < cv.chunks; c++) {
    ImVec2 a0, a1;
    const auto& row = cv.cells[static_cast<size_t>(r)];
    if (c >= static_cast<int>(row.size()) || !cell_rect(L, cv, r, c, a0, a1)) continue;
    if (mouse.x >= a0.x && mouse.x < a1.x && mouse.y >= a0.y && mouse.y < a1.y) {
      const int held = row[static_cast<size_t>(c)];
      ImGui::BeginTooltip();
      if (cv.chunks > 1) ImGui::Text("rank %d, chunk %d", global_rank(cv, r), c);
      else ImGui::Text("rank %d's buffer", global_rank(cv, r));
      if (held <= 0) ImGui::TextUnformatted("not received yet");
      else if (held >= N) ImGui::TextUnformatted("final: holds every rank's contribution");
      else ImGui::Text("holds %d of %d ranks' contributions", held, N);
      ImGui::EndTooltip();
      return true;
    }
  }
  return false;
}

// Tooltips: a node tells what its rank does; a cell what it holds; a chunk where it goes.
void ring_tooltips(const Snapshot& s, const RingLayout& L, const std::vector<Chunk>& chunks, int N, bool valid, ImVec2 mouse) {
  const CollectiveView& cv = s.collective;
  for (const Chunk& ch : chunks) {
    if (std::fabs(mouse.x - ch.pos.x) <= ch.half * 1.2f && std::fabs(mouse.y - ch.pos.y) <= ch.half * 1.2f) {
      ImGui::BeginTooltip();
      const int src = global_rank(cv, ch.t->src), dst = global_rank(cv, ch.t->dst);
      if (ch.t->chunk >= 0) ImGui::Text("chunk %d: rank %d -> rank %d", ch.t->chunk, src, dst);
      else ImGui::Text("buffer: rank %d -> rank %d", src, dst);
      ImGui::Text("carries %d of %d contributions; the receiver %s it", ch.held, N, ch.t->reduce ? "adds" : "copies");
      ImGui::EndTooltip();
      return;
    }
  }
  for (int r = 0; r < N; r++) {
    if (length(mouse - L.node[static_cast<size_t>(r)]) <= L.node_r) {
      node_tooltip(s, cv, r);
      return;
    }
    if (valid && L.cells && cell_tooltip(L, cv, r, N, mouse)) return;
  }
}

}  // namespace

void draw_ring_view(const Snapshot& s, ViewContext& ctx, RingViewState& state) {
  RingViewState::Impl& st = *state.impl;
  draw_focus_line(s);
  const CollectiveView& cv = s.collective;
  const float fs = ImGui::GetFontSize();
  const int N = std::clamp(cv.valid ? cv.world : std::max(1, s.config.world), 1, 64);
  const bool valid = cv.valid && static_cast<int>(cv.cells.size()) >= N;

  if (valid) draw_header(cv, ctx.presentation);
  else ImGui::TextDisabled("ring view: %d rank%s", N, N == 1 ? "" : "s");
  // No collective yet: the hint in the ring's middle, or where the ring is too small to hold it (a tile
  // in presentation mode at 1280 x 720 put it over the ranks), on a line above it.
  const ImVec2 room_left = ImGui::GetContentRegionAvail();
  const bool hint_above = !valid && N > 1 && std::min(room_left.x, room_left.y) < fs * 22;
  if (hint_above) {
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextUnformatted("No collective yet: press C (next collective) or Space (run)");
    ImGui::PopTextWrapPos();
  }

  // Canvas: the rest of the window; an invisible button owns the mouse.
  const ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImVec2 size = ImGui::GetContentRegionAvail();
  size.x = std::max(size.x, fs * 4);
  size.y = std::max(size.y, fs * 4);
  ImGui::InvisibleButton("##ring_canvas", size);
  const bool hovered = ImGui::IsItemHovered();
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  dl->PushClipRect(p0, p0 + size, true);

  const bool ring = valid && ring_edges(cv);
  const bool legend_line = legend_one_line(N, fs, ring, size.x - fs * 0.6f);
  const float legend_h = valid ? fs * (legend_line ? 1.5f : 2.7f) : 0.0f;
  const RingLayout& L = cached_ring_layout(st.layout, p0, ImVec2(size.x, size.y - legend_h), N, valid ? cv.chunks : 1, fs, valid);

  // The ring itself, faint, so every algorithm reads as the same world.
  if (N > 1) dl->AddCircle(L.center, L.radius, ImGui::GetColorU32(ImGuiCol_Border, 0.6f), 96, std::max(1.0f, fs * 0.06f));

  const bool hub = valid && N > 1 && cv.algo == Algorithm::InNetwork;
  const float hub_half = std::clamp(L.radius * 0.12f, fs * 1.2f, fs * 2.4f);
  if (valid && cv.algo == Algorithm::Hierarchical) draw_node_groups(dl, L, cv, fs);

  // Center: the step counter, and who the world waits for; under the edges, so moving chunks stay in
  // view (below the switch when there is one).
  if (N > 1 || !valid) {
    const float room = N > 1 ? (L.radius - L.node_r) * 1.6f : size.x;
    if (!valid && !hint_above) draw_hint(dl, L, N, room, size.x, fs);
    else draw_step_counter(dl, L, cv, room, fs, hub ? hub_half + fs * 3.0f : 0.0f, N == 2 && !hub ? kTwoRankBulge : 0.0f, p0.x);
  }

  std::vector<Chunk> chunks;
  if (valid && N > 1) {
    const Edges edges{L, N == 2 ? kTwoRankBulge : (ring ? 0.1f : 0.07f), L.node_r + std::max(3.0f, fs * 0.25f),
                      hub ? hub_half * 1.1f : 0.0f};
    draw_edges(dl, edges, cv, N, ring, fs);
    if (hub) draw_switch(dl, L.center, hub_half, fs, !cv.pending.empty());
    const float phase = static_cast<float>(ctx.time * 0.6 - std::floor(ctx.time * 0.6));
    const float half = std::clamp(L.node_r * 0.4f, fs * 0.3f, fs * 0.8f);
    chunks = pending_chunks(edges, cv, N, phase, half);
    draw_chunk_sprites(dl, edges, chunks, phase, half, ctx, st);
  }
  draw_nodes(dl, L, cv, N, valid, chunks, fs, ctx.time);

  if (valid && N > 1)
    draw_legend(dl, ImVec2(p0.x + fs * 0.3f, p0.y + size.y - legend_h + fs * 0.25f), N, fs, ring, legend_line, size.x - fs * 0.6f);
  if (valid && N > 1) draw_algorithm_key(dl, p0 + ImVec2(fs * 0.3f, fs * 0.3f), cv, fs);
  dl->PopClipRect();
  if (hovered) ring_tooltips(s, L, chunks, N, valid, mouse);
}

}  // namespace dtlab::app
