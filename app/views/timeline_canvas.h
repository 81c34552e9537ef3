// What the live timeline (timeline_view.cpp) and an imported trace's timeline (trace_view.cpp)
// share: the axis from time to pixels, a header strip over a scrolling child of rank lanes, each an
// invisible button that owns the mouse, wheel zoom around the cursor and drag to pan, the cursor's
// time in the header, and the tinted label column of a rank.
#pragma once
#include <imgui.h>

#include <algorithm>

namespace dtlab::app {

// Per-frame geometry shared by the ruler and every lane. The unit is the view's: seconds on the
// live timeline, µs on a trace's aligned clock.
struct TimeAxis {
  double t0 = 0, t1 = 1;
  float x0 = 0, x1 = 1;
  double px_per_unit = 1;
  float x(double t) const {  // clamped so a far-off time never overflows a float
    return x0 + static_cast<float>(std::clamp((t - t0) * px_per_unit, -1e6, 1e6));
  }
  double t(float px) const { return t0 + static_cast<double>(px - x0) / px_per_unit; }
  // Shows [v0, v1] (at least `min_range` wide) between x0 and x1.
  void set(double v0, double v1, double min_range) {
    t0 = v0, t1 = v1;
    px_per_unit = static_cast<double>(x1 - x0) / std::max(t1 - t0, min_range);
  }
};

// The header (ruler and strips, on the parent window) and the lanes below it (a child window the
// caller ends with ImGui::EndChild()), and how the mouse stands over them this frame.
struct TimelineCanvas {
  ImVec2 header_pos, lanes_pos;  // screen positions of the header and of the lanes' first row
  float label_w = 0;             // the label column at the lanes' left
  float lanes_w = 0;             // the lanes' width, label column included
  float lanes_h = 0;             // the rows' total height
  float window_y0 = 0, window_y1 = 0;  // the part of the lanes the child window shows
  bool header_hovered = false, header_active = false;
  bool canvas_hovered = false, canvas_active = false, clicked = false;

  bool hovered() const { return header_hovered || canvas_hovered; }
  // The axis right of the label column, showing [t0, t1] (at least `min_range` wide).
  TimeAxis axis(double t0, double t1, double min_range) const {
    TimeAxis ax;
    ax.x0 = lanes_pos.x + label_w, ax.x1 = lanes_pos.x + lanes_w;
    ax.set(t0, t1, min_range);
    return ax;
  }
  bool visible(float y, float h) const { return y <= window_y1 && y + h >= window_y0; }  // a row [y, y + h] on screen
  // Wheel: zoom around the cursor's time, to a range in [min_range, max_range]. Dragging (left or
  // middle): pan in time, and scroll the ranks. Updates [t0, t1] from `ax` (this frame's axis);
  // true when the user zoomed or panned.
  bool zoom_and_pan(const TimeAxis& ax, double& t0, double& t1, double min_range, double max_range) const;
  bool double_clicked() const;
};

// The ImGui ids of the header's button, the lanes' child window and the lanes' button.
struct TimelineIds {
  const char* header;
  const char* lanes;
  const char* canvas;
};
// Lays out the header (header_h high) and begins the lanes' child, `ranks` rows of rank_h (scrolled
// when taller than the room left); the caller ends the child.
TimelineCanvas begin_timeline_canvas(const TimelineIds& ids, float header_h, float label_w, float rank_h, int ranks);

// The time under the cursor on a dark chip at the header's top (y), from x: the chip's x is
// cursor_chip_x, right of the cursor or left of the axis's end.
float cursor_chip_x(const TimeAxis& ax, float mouse_x, float text_w);
void draw_cursor_chip(ImDrawList* dl, const char* text, ImVec2 text_size, float x, float y, float text_dy);

// A rank's label column [x, x + w] over [y0, y1]: one opaque fill (the window background tinted a
// tenth of the way towards the rank's color), the rank's color bar at its left.
void draw_rank_label_bg(ImDrawList* dl, int rank, int world, float x, float y0, float y1, float w, float fs);

}  // namespace dtlab::app
