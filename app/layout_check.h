// What a person would see cut off: every visible window (and child region) whose items reach past
// its right edge with no scrollbar to reach them, or that hides part of its content behind a
// vertical scrollbar. Read from ImGui's own window records after a frame (content size against
// the inner rectangle), so it sees what the views laid out, not what they meant to.
#pragma once
#include <string>
#include <vector>

namespace dtlab::app {

struct ClippedWindow {
  std::string name;     // "Ring", "Run/##rows_1A2B" (a child region under its window)
  bool cut_right = false;  // items past the right edge, no horizontal scrollbar
  bool scrolls = false;    // content taller than the window: a vertical scrollbar hides some
  float content_w = 0, content_h = 0, inner_w = 0, inner_h = 0;
};

// The visible windows of the last frame that clip their content; tooltips and popups aside.
std::vector<ClippedWindow> clipped_windows();
// One line per window: "Ring: content 812 x 400 px in 700 x 380 (cut on the right)".
std::string describe(const ClippedWindow& w);

}  // namespace dtlab::app
