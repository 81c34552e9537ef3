#include "app/layout_check.h"

#include <imgui.h>
#include <imgui_internal.h>

#include <cstdio>

namespace dtlab::app {

std::vector<ClippedWindow> clipped_windows() {
  std::vector<ClippedWindow> out;
  ImGuiContext* g = ImGui::GetCurrentContext();
  if (!g) return out;
  for (ImGuiWindow* w : g->Windows) {
    if (!w->WasActive || w->Hidden || (w->Flags & (ImGuiWindowFlags_Tooltip | ImGuiWindowFlags_Popup))) continue;
    if (w->Collapsed || w->SkipItems) continue;
    ClippedWindow c;
    c.name = w->Name;
    c.inner_w = w->InnerRect.GetWidth() - 2 * w->WindowPadding.x;
    c.inner_h = w->InnerRect.GetHeight() - 2 * w->WindowPadding.y;
    c.content_w = w->ContentSize.x;
    c.content_h = w->ContentSize.y;
    c.cut_right = !w->ScrollbarX && c.content_w > c.inner_w + 1.0f;
    c.scrolls = w->ScrollbarY;
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

}  // namespace dtlab::app
