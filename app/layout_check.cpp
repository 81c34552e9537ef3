#include "app/layout_check.h"

#include <imgui.h>
#include <imgui_internal.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <map>
#include <set>
#include <tuple>
#include <utility>

namespace dtlab::app {

namespace {

// Regions that scroll by design: lists whose length grows with the world or the model (the
// timeline's rank lanes, DDP's bucket rows, the inspector's per-rank table) and the forms (the Run
// panel, a lesson's prose, the A/B settings, the Sizing view's sliders). Every other window must show its content whole.
bool scrolls_by_design(const ImGuiWindow* w) {
  static const char* kLists[] = {"##tl_lanes", "##bucket_rows", "##list", "##sizing_controls"};
  static const char* kForms[] = {"Run", "Collective", "Lesson", "A/B comparison"};
  const std::string name = w->Name;
  for (const char* l : kLists)
    if (name.find(l) != std::string::npos) return true;
  const ImGuiWindow* root = w->RootWindow ? w->RootWindow : w;
  for (const char* f : kForms)
    if (std::string(root->Name) == f) return true;
  return false;
}

bool checked(const ImGuiWindow* w) {
  return w->WasActive && !w->Hidden && !(w->Flags & (ImGuiWindowFlags_Tooltip | ImGuiWindowFlags_Popup)) && !w->Collapsed &&
         !w->SkipItems;
}

}  // namespace

std::vector<ClippedWindow> clipped_windows() {
  std::vector<ClippedWindow> out;
  ImGuiContext* g = ImGui::GetCurrentContext();
  if (!g) return out;
  for (ImGuiWindow* w : g->Windows) {
    if (!checked(w)) continue;
    ClippedWindow c;
    c.name = w->Name;
    c.inner_w = w->InnerRect.GetWidth() - 2 * w->WindowPadding.x;
    c.inner_h = w->InnerRect.GetHeight() - 2 * w->WindowPadding.y;
    c.content_w = w->ContentSize.x;
    c.content_h = w->ContentSize.y;
    c.cut_right = !w->ScrollbarX && c.content_w > c.inner_w + 1.0f;
    c.scrolls = w->ScrollbarY && !scrolls_by_design(w);
    if (c.cut_right || c.scrolls) out.push_back(c);
  }
  return out;
}

std::string describe(const ClippedWindow& w) {
  char b[320];
  std::snprintf(b, sizeof b, "%s: content %.0f x %.0f px in %.0f x %.0f (%s%s%s)", w.name.c_str(), w.content_w, w.content_h,
                w.inner_w, w.inner_h, w.cut_right ? "cut on the right" : "", w.cut_right && w.scrolls ? ", " : "",
                w.scrolls ? "scrolls" : "");
  return b;
}

std::vector<TextFault> text_faults() {
  std::vector<TextFault> out;
  ImGuiContext* g = ImGui::GetCurrentContext();
  if (!g) return out;
  const ImFontAtlas* atlas = ImGui::GetIO().Fonts;
  // Geometry that is not text: ImGui's solid shapes sample the atlas's white pixel, its thick
  // anti-aliased lines the baked lines at TexUvLines.
  const ImVec2 white = atlas->TexUvWhitePixel;
  ImVec4 lines(1, 1, 0, 0);
  for (const ImVec4& l : atlas->TexUvLines)
    lines = ImVec4(std::min(lines.x, l.x), std::min(lines.y, l.y), std::max(lines.z, l.z), std::max(lines.w, l.w));
  auto solid = [&](const ImVec2& uv) {
    return (uv.x == white.x && uv.y == white.y) || (uv.x >= lines.x && uv.x <= lines.z && uv.y >= lines.y && uv.y <= lines.w);
  };
  for (ImGuiWindow* w : g->Windows) {
    if (!checked(w) || !w->DrawList) continue;
    const ImDrawList* dl = w->DrawList;
    const bool list = scrolls_by_design(w);
    std::vector<ImRect> glyphs, whole;  // clipped to what shows, and whole
    bool cut = false;
    for (const ImDrawCmd& cmd : dl->CmdBuffer) {
      if (cmd.UserCallback || cmd.TextureId != atlas->TexID) continue;
      const ImRect clip(cmd.ClipRect.x, cmd.ClipRect.y, cmd.ClipRect.z, cmd.ClipRect.w);
      ImRect last(0, 0, 0, 0);
      for (unsigned i = 0; i + 2 < cmd.ElemCount; i += 3) {
        const ImDrawVert* v[3];
        bool text = false;
        for (int k = 0; k < 3; k++) {
          v[k] = &dl->VtxBuffer[static_cast<int>(cmd.VtxOffset + dl->IdxBuffer[static_cast<int>(cmd.IdxOffset + i + static_cast<unsigned>(k))])];
          text = text || !solid(v[k]->uv);
        }
        if (!text) continue;
        ImRect r(v[0]->pos, v[0]->pos);
        r.Add(v[1]->pos), r.Add(v[2]->pos);
        if (r.Min.x == last.Min.x && r.Min.y == last.Min.y && r.Max.x == last.Max.x && r.Max.y == last.Max.y) continue;  // a quad's second half
        last = r;
        if (r.GetWidth() < 1 || r.GetHeight() < 1 || !r.Overlaps(clip)) continue;
        // Cut by its clip rectangle: across the left or right edge where the window cannot scroll
        // sideways, across the top or bottom where it cannot scroll down (a list's rows may be half
        // scrolled out; that is the list, not a fault).
        // (1.5 px of slack: a glyph's bearing may reach a pixel past the pen position it was drawn at.)
        const bool cut_x = (r.Min.x < clip.Min.x - 1.5f || r.Max.x > clip.Max.x + 1.5f) && !w->ScrollbarX;
        const bool cut_y = (r.Min.y < clip.Min.y - 1.5f || r.Max.y > clip.Max.y + 1.5f) && !w->ScrollbarY && !list;
        if ((cut_x || cut_y) && !cut) {
          out.push_back({w->Name, false, r.Min.x, r.Min.y});
          cut = true;  // one report per window
        }
        whole.push_back(r);
        r.ClipWithFull(clip);
        glyphs.push_back(r);
      }
    }
    // A glyph drawn again 1 px to its right is the faux bold of a font with no bold face (the lessons'
    // Strong spans): one glyph to the eye, so the copy is left out.
    std::set<std::tuple<long, long, long, long>> at;
    auto key = [](const ImRect& r, float dx) {
      return std::make_tuple(std::lround((r.Min.x + dx) * 64), std::lround(r.Min.y * 64), std::lround(r.GetWidth() * 64), std::lround(r.GetHeight() * 64));
    };
    for (const ImRect& r : whole) at.insert(key(r, 0));
    std::vector<char> copy(glyphs.size(), 0);
    for (size_t i = 0; i < glyphs.size(); i++) copy[i] = at.count(key(whole[i], -1.0f)) > 0;
    // Text over text: two glyph boxes sharing more than 30% of the smaller one (neighbouring
    // glyphs of one line touch by a pixel at most). Bucketed by 32 px cells.
    std::map<std::pair<int, int>, std::vector<int>> cells;
    for (int i = 0; i < static_cast<int>(glyphs.size()); i++) {
      if (copy[static_cast<size_t>(i)]) continue;
      // A glyph mostly scrolled out of its region (a code block's line under its scrollbar's thumb):
      // the slivers left of two neighbours are not text over text.
      if (glyphs[static_cast<size_t>(i)].GetArea() < 0.5f * whole[static_cast<size_t>(i)].GetArea()) continue;
      const ImRect& r = glyphs[static_cast<size_t>(i)];
      for (int cx = static_cast<int>(r.Min.x) / 32; cx <= static_cast<int>(r.Max.x) / 32; cx++)
        for (int cy = static_cast<int>(r.Min.y) / 32; cy <= static_cast<int>(r.Max.y) / 32; cy++) cells[{cx, cy}].push_back(i);
    }
    bool overlap = false;
    for (const auto& [cell, ids] : cells) {
      for (size_t a = 0; a < ids.size() && !overlap; a++)
        for (size_t b = a + 1; b < ids.size() && !overlap; b++) {
          ImRect x = glyphs[static_cast<size_t>(ids[a])];
          const ImRect& y = glyphs[static_cast<size_t>(ids[b])];
          if (!x.Overlaps(y)) continue;
          const float smaller = std::min(x.GetArea(), y.GetArea());
          x.ClipWithFull(y);
          if (smaller > 0 && x.GetArea() > 0.3f * smaller) {
            out.push_back({w->Name, true, x.Min.x, x.Min.y});
            overlap = true;  // one report per window
          }
        }
      if (overlap) break;
    }
  }
  return out;
}

std::string describe(const TextFault& f) {
  char b[320];
  std::snprintf(b, sizeof b, "%s: text %s at (%.0f, %.0f)", f.window.c_str(), f.overlap ? "over text" : "cut", f.x, f.y);
  return b;
}

}  // namespace dtlab::app
