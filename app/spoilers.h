// No spoilers: while a lesson's question waits for Check, the views that would show its answer are
// covered, and `dtlab --lesson NAME --play --check-spoilers` reads back what the screen really
// showed before each check (the text of every window, recovered from ImGui's draw data) and fails
// when the answer the engine then revealed was already on it.
#pragma once
#include <imgui.h>

#include <string>
#include <vector>

#include "app/lesson.h"

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
// "Buckets: 'bucket 0: 4,547 B'"; "" when none does. A number followed by another unit than the
// question's `unit` ("73.1 KiB" for an answer in GB) is another quantity, as in the text check.
std::string find_spoiler(const std::vector<ScreenLine>& lines, const std::vector<std::string>& spellings, const std::string& unit = "");

// The lesson's own text, which no view covers: what a learner has read of it before question `step`
// is checked. The title and the summary, every step's heading and prose up to this one, the earlier
// questions' asks and explanations, and this question's ask, one line per block, each named by
// where it stands ("title", "step 3 'Sharded'"). {{figures}} are left out (the screen check reads
// them as drawn), and so is inline `code` (a command's flags, `--seq 2048`).
std::vector<ScreenLine> lesson_text_before(const Lesson& lesson, int step);
// How prose may give away `v`: answer_spellings(v, exact), and, for a number too plain for those
// (16, 0.5), the number followed by the question's unit: "16 bytes per parameter" gives a 16 away
// where "16 GPUs" does not.
std::vector<std::string> text_spellings(double v, bool exact, const std::string& unit);
// The first place the lesson gives question `step`'s answer `v` away before its check, as
// "step 1 'Two bytes': '...'" or "step 2's answer (4548), which this question takes within its
// tolerance"; "" when it does not. Looks in lesson_text_before, and among the answers of the earlier
// questions (`earlier[k]`: question k's revealed answer, NaN where none). The rules:
// - the answer as answer_spellings writes it, or too plain for those, with the question's unit
//   ("16 bytes"); a number that names another unit of count ("2048 tokens") is another quantity;
// - the answer stated in another unit of the same measure ("1.5 s" for 1500 ms, "4 KiB" for 4096
//   bytes), converted, within the question's tolerance;
// - an earlier answer in the same unit that the question would take as right, not too plain;
// - a choice question asking what comes first or last, when the text spells out an order
//   ("layer 4 comes first, then 2, then 0") whose first or last item names the right choice
//   (a word or number that no other choice has). A choice's number is its place in the list, so
//   the number rules do not apply to choices.
std::string find_text_spoiler(const Lesson& lesson, int step, double v, const std::vector<double>& earlier);

// A question whose answer is a bare guess: "none" (0), or "all" / "the same" (1 for a share or a
// ratio with no unit, 100 in %), where the question would take that guess as right. A learner who
// guesses that nothing changes, or everything does, is right without reasoning, and the text before
// such a question has usually just said the rule that makes it so ("switch set_epoch off" before
// "what share stays?", "TP inside a node" before "how many TP groups span two nodes?"). Returns the
// guess as a learner would say it ("'none' (0)"), or "". Choice questions are left out: there the
// alternatives are on screen, and "none" is one answer among them.
std::string bare_guess(const Question& q, double v);

// A figure's value when it needs no run: the planner's and the cost model's formulas (plan.*,
// algo.*, cost.*, ...) and plain arithmetic; NaN for a figure the engine reveals live.
double value_without_run(const Figure& f);


}  // namespace dtlab::app
