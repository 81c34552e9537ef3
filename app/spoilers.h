// No spoilers: while a lesson's question waits for Check, the views that would show its answer are
// covered, and `dtlab --lesson NAME --play --check-spoilers` reads back what the screen really
// showed before each check (the text of every window, recovered from ImGui's draw data) and fails
// when the answer the engine then revealed was already on it.
#pragma once
#include <imgui.h>

#include <string>
#include <vector>

namespace dtlab::app {

// The views (by their script names: "ring", "buckets", ...) that draw the live figure with this
// signature ("collective.steps", "bucket[I].bytes", "memory.rank[R].total"); empty for figures no
// view draws (the planner's formulas, marks).
std::vector<std::string> views_drawing(const std::string& signature);

// One line of text as drawn: the window it is in ("Buckets"; a child window counts as its parent)
// and its characters left to right (a wide gap between glyphs becomes a space).
struct ScreenLine {
  std::string window;
  std::string text;
};
// Every text line in the draw data, read from the glyph quads' texture coordinates in the font
// atlas, so text drawn by ImGui::Text and by ImDrawList::AddText alike.
std::vector<ScreenLine> screen_text(const ImDrawData& data);

// How a view may print the number v: "4547", "4,547", "17.8 KiB", "0.75", "75%", ... Empty when v
// is too plain to tell apart from other numbers on screen (small whole numbers, 0.5): such answers
// are not checked this way. `exact`: the question takes only v itself (a whole number without a
// tolerance), so a rounded spelling such as "4.4 KiB" gives nothing away and is left out.
std::vector<std::string> answer_spellings(double v, bool exact = false);
// The first line that shows one of `spellings` as a whole token (not inside a longer number), as
// "Buckets: 'bucket 0: 4,547 B'"; "" when none does.
std::string find_spoiler(const std::vector<ScreenLine>& lines, const std::vector<std::string>& spellings);

}  // namespace dtlab::app
