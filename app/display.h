// The window on the screen it is shown on: sized to the monitor, fonts and spacing at the display's
// content scale, and full screen on F11 or --fullscreen. A projector, a HiDPI laptop and a 1366x768
// screen each get a window that fits and text that reads at the size its desktop uses.
#pragma once
#include <algorithm>
#include <cmath>

struct GLFWwindow;
struct GLFWmonitor;

namespace dtlab::app {

struct ScreenRect {
  int x = 0, y = 0, w = 0, h = 0;
};

// Where a window opens on a monitor whose work area (the screen less its panels) is `area`: 90% of
// it in each direction, centred, so the title bar and the desktop's edges stay in reach; never
// larger than the area. An explicit width or height (> 0) wins for that direction.
inline ScreenRect fit_window(const ScreenRect& area, int width = 0, int height = 0) {
  ScreenRect r;
  r.w = width > 0 ? width : std::max(320, area.w * 9 / 10);
  r.h = height > 0 ? height : std::max(240, area.h * 9 / 10);
  r.x = area.x + std::max(0, (area.w - r.w) / 2);
  r.y = area.y + std::max(0, (area.h - r.h) / 2);
  return r;
}

// The scale of fonts and spacing: `forced` (--scale) when > 0, else the display's content scale
// (1 on a plain 96-dpi screen, 2 on most HiDPI laptops), kept within [0.5, 4].
inline float ui_scale(float content_scale, float forced) {
  const float s = forced > 0 ? forced : content_scale;
  if (!(s > 0)) return 1.0f;  // a display that reports nothing (or NaN)
  return std::clamp(s, 0.5f, 4.0f);
}

// The monitor that holds the centre of the window (the primary monitor when none does).
GLFWmonitor* monitor_of(GLFWwindow* win);

// Full screen on the window's monitor at its current mode, and back to the place it had before.
class FullScreen {
 public:
  bool on(GLFWwindow* win) const;
  void toggle(GLFWwindow* win);
  void set(GLFWwindow* win, bool full);

 private:
  ScreenRect windowed_;  // the window's place before it went full screen
};

// Presentation's type in pixels before the content scale, for a window `height` logical pixels
// tall: 28 from 840 up, a thirtieth of the height below (24 at 720), never under 20. Four tiles of
// 28-pixel type do not fit a 720-pixel-high window: its rows fell out of the timeline and memory.
inline float presentation_font_px(float height) { return std::clamp(std::round(height / 30.0f), 20.0f, 28.0f); }

}  // namespace dtlab::app
