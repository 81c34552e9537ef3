#include "app/display.h"

#include <GLFW/glfw3.h>

#include <algorithm>

namespace dtlab::app {

GLFWmonitor* monitor_of(GLFWwindow* win) {
  int x = 0, y = 0, w = 0, h = 0;
  glfwGetWindowPos(win, &x, &y);
  glfwGetWindowSize(win, &w, &h);
  const int cx = x + w / 2, cy = y + h / 2;
  int count = 0;
  GLFWmonitor** monitors = glfwGetMonitors(&count);
  for (int i = 0; i < count; i++) {
    int mx = 0, my = 0;
    glfwGetMonitorPos(monitors[i], &mx, &my);
    const GLFWvidmode* mode = glfwGetVideoMode(monitors[i]);
    if (mode && cx >= mx && cx < mx + mode->width && cy >= my && cy < my + mode->height) return monitors[i];
  }
  return glfwGetPrimaryMonitor();
}

bool FullScreen::on(GLFWwindow* win) const { return glfwGetWindowMonitor(win) != nullptr; }

void FullScreen::set(GLFWwindow* win, bool full) {
  if (full == on(win)) return;
  if (full) {
    GLFWmonitor* mon = monitor_of(win);
    const GLFWvidmode* mode = mon ? glfwGetVideoMode(mon) : nullptr;
    if (!mode) return;  // no monitor to fill: stay windowed
    glfwGetWindowPos(win, &windowed_.x, &windowed_.y);
    glfwGetWindowSize(win, &windowed_.w, &windowed_.h);
    glfwSetWindowMonitor(win, mon, 0, 0, mode->width, mode->height, mode->refreshRate);
  } else {
    glfwSetWindowMonitor(win, nullptr, windowed_.x, windowed_.y, std::max(320, windowed_.w),
                         std::max(240, windowed_.h), 0);
  }
}

void FullScreen::toggle(GLFWwindow* win) { set(win, !on(win)); }

}  // namespace dtlab::app
