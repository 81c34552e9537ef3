// What a person would see cut off or garbled, read from ImGui's own records after a frame, so it
// sees what the views laid out, not what they meant to:
// - windows (and child regions) whose items reach past the right edge with no scrollbar to reach
//   them, or that hide part of their content behind a vertical scrollbar, except the lists that
//   scroll by design (kScrollingLists: rows that grow with the world or the model, and forms);
// - text cut by its window's edge: a glyph of the frame's draw lists that its clip rectangle cuts
//   through (text a view clips on purpose, like a label fitted into a span, is trimmed by ImGui
//   itself and never seen as cut);
// - text over text: two glyphs of one window's draw list covering each other.
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

// Text a person cannot read whole in the last frame: its window, what is wrong, and where (screen px).
struct TextFault {
  std::string window;
  bool overlap = false;  // false: cut by the window's (or a region's) edge
  float x = 0, y = 0;    // the glyph's top left
};
std::vector<TextFault> text_faults();
// "Ring: text cut at (1203, 540)" / "Memory: text over text at (880, 612)".
std::string describe(const TextFault& f);

}  // namespace dtlab::app
