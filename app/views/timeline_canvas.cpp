// The timelines' shared canvas (timeline_canvas.h).
#include "app/views/timeline_canvas.h"

#include <imgui_internal.h>  // SetItemUsingMouseWheel: over a timeline the wheel zooms, never scrolls

#include <cmath>

#include "app/views/views.h"

namespace dtlab::app {

TimelineCanvas begin_timeline_canvas(const TimelineIds& ids, float header_h, float label_w, float rank_h, int ranks) {
  const float fs = ImGui::GetFontSize();
  ImVec2 avail = ImGui::GetContentRegionAvail();
  avail.x = std::max(avail.x, label_w + 4 * fs);
  avail.y = std::max(avail.y, header_h + 2 * fs);
  const float rows_h = std::max(static_cast<float>(ranks) * rank_h, 1.0f);
  TimelineCanvas c;
  c.label_w = label_w;
  c.header_pos = ImGui::GetCursorScreenPos();
  const ImGuiButtonFlags buttons = ImGuiButtonFlags_MouseButtonLeft | ImGuiButtonFlags_MouseButtonMiddle;
  ImGui::InvisibleButton(ids.header, ImVec2(avail.x, header_h), buttons);
  ImGui::SetItemUsingMouseWheel();
  c.header_hovered = ImGui::IsItemHovered(), c.header_active = ImGui::IsItemActive();

  // What is left below the header (its item spacing included: avail.y - header_h overflowed the
  // window by that spacing, and the view scrolled by 3 pixels).
  // The lanes are a list that scrolls: in a short tile it may show less than one rank's rows, never
  // more than the window holds.
  const float lanes_h = std::max(ImGui::GetContentRegionAvail().y, 2 * fs);
  ImGui::BeginChild(ids.lanes, ImVec2(avail.x, lanes_h), false, ImGuiWindowFlags_NoScrollWithMouse);
  c.lanes_pos = ImGui::GetCursorScreenPos();
  c.lanes_w = std::max(ImGui::GetContentRegionAvail().x, label_w + 4 * fs);
  c.lanes_h = rows_h;
  c.clicked = ImGui::InvisibleButton(ids.canvas, ImVec2(c.lanes_w, std::max(rows_h, ImGui::GetContentRegionAvail().y)), buttons);
  ImGui::SetItemUsingMouseWheel();
  c.canvas_hovered = ImGui::IsItemHovered(), c.canvas_active = ImGui::IsItemActive();
  c.window_y0 = ImGui::GetWindowPos().y, c.window_y1 = c.window_y0 + ImGui::GetWindowHeight();
  return c;
}

bool TimelineCanvas::zoom_and_pan(const TimeAxis& ax, double& t0, double& t1, double min_range, double max_range) const {
  const ImGuiIO& io = ImGui::GetIO();
  bool moved = false;
  if (hovered() && io.MouseWheel != 0) {
    const double tm = ax.t(std::clamp(io.MousePos.x, ax.x0, ax.x1)), range = ax.t1 - ax.t0;
    const double f = std::clamp(std::pow(1.25, -static_cast<double>(io.MouseWheel)), min_range / range, max_range / range);
    t0 = tm - (tm - ax.t0) * f, t1 = tm + (ax.t1 - tm) * f;
    moved = true;
  }
  if ((header_active || canvas_active) &&
      (ImGui::IsMouseDragging(ImGuiMouseButton_Left, 1.0f) || ImGui::IsMouseDragging(ImGuiMouseButton_Middle, 1.0f))) {
    if (io.MouseDelta.x != 0) {
      const double dt = -static_cast<double>(io.MouseDelta.x) / ax.px_per_unit;
      t0 += dt, t1 += dt;
      moved = true;
    }
    if (canvas_active && io.MouseDelta.y != 0) ImGui::SetScrollY(ImGui::GetScrollY() - io.MouseDelta.y);
  }
  return moved;
}

bool TimelineCanvas::double_clicked() const { return hovered() && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left); }

float cursor_chip_x(const TimeAxis& ax, float mouse_x, float text_w) { return std::min(std::floor(mouse_x) + 4.5f, ax.x1 - text_w - 6); }

void draw_cursor_chip(ImDrawList* dl, const char* text, ImVec2 text_size, float x, float y, float text_dy) {
  dl->AddRectFilled(ImVec2(x - 2, y + 1), ImVec2(x + text_size.x + 4, y + 1 + text_size.y), IM_COL32(40, 44, 52, 240));
  dl->AddText(ImVec2(x + 1, y + 1 + text_dy), IM_COL32(255, 236, 140, 255), text);
}

void draw_rank_label_bg(ImDrawList* dl, int rank, int world, float x, float y0, float y1, float w, float fs) {
  const ImVec4 bg = ImGui::GetStyleColorVec4(ImGuiCol_WindowBg), rc = ImGui::ColorConvertU32ToFloat4(rank_color(rank, world));
  const ImVec4 tint(bg.x + 0.1f * (rc.x - bg.x), bg.y + 0.1f * (rc.y - bg.y), bg.z + 0.1f * (rc.z - bg.z), 1.0f);
  dl->AddRectFilled(ImVec2(x, y0), ImVec2(x + w, y1), ImGui::ColorConvertFloat4ToU32(tint));
  dl->AddRectFilled(ImVec2(x, y0), ImVec2(x + 0.3f * fs, y1), rank_color(rank, world));
}

}  // namespace dtlab::app
