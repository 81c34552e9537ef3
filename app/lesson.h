// Lessons: a guided course in Markdown files (lessons/*.md) that a teacher edits. A lesson is a
// header (title, minutes, and the scenario as dtlab's own flags) and steps (`## ` headings), each
// with prose (Markdown, parsed by md4c), actions for the engine (```action blocks) and at most one
// question (a ```question block) whose answer is a live figure (app/figures.h) read after the
// reveal action ran. lessons/README.md documents the format. The parser is strict: any mistake is
// one LessonError "lessons/x.md:12: sentence"; app/lesson_runner.h plays a parsed lesson.
//
// A question's figures are read once and then kept, so a question never changes under the learner
// (the run goes on after Check: a reveal steps it, a later Check or a frame drawn later must not
// rewrite what was asked or answered):
//   - ask: when the question is asked, i.e. once the step's actions have run and before any
//     reveal action (until then, while those actions run, the text shows the live figures);
//   - answer:, choice values and expect: at the reveal, after its actions, as the answer is defined;
//   - explain: at the reveal too, on the same snapshot as the answer, because a model answer quotes
//     what the reveal produced (the bytes a ring sent, the ranks a watchdog named). To speak of the
//     state the question was asked in, mark it in the step (`mark NAME`) and write at("NAME", ...).
// A second Check grades the new answer against the answer already revealed. Going back, or
// entering the step again, asks the question anew. Prose outside questions stays live.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "app/figures.h"
#include "app/options.h"
#include "app/script.h"
#include "engine/comm/threads_backend.h"  // Fault
#include "engine/core/check.h"

namespace dtlab::app {

// what(): "lessons/x.md:12: unknown action 'stp collective'; did you mean 'step collective'?"
struct LessonError : Error {
  LessonError(std::string file, int line, std::string sentence);
  std::string file;
  int line = 0;
  std::string sentence;
};

// Prose, as md4c parsed it: blocks of styled spans, for the lesson panel to lay out.
struct Span {
  enum Style : uint8_t { Plain = 0, Em = 1, Strong = 2, Code = 4, Link = 8 };
  std::string text;
  uint8_t style = Plain;
  int figure = -1;  // {{expr}}: index into Lesson::figures, drawn as its live value
};
struct Block {
  enum Kind : uint8_t { Paragraph, Heading, Item, Code, Quote, Rule, TableRow };
  Kind kind = Paragraph;
  int level = 0;                          // Heading: 1..6; Item: list depth (1 = top); TableRow: 1 = header
  std::string bullet;                     // Item: "•" or "3."
  std::vector<Span> spans;                // Paragraph, Heading, Item, Quote
  std::vector<std::vector<Span>> cells;   // TableRow
  std::string code;                       // Code
};
using Prose = std::vector<Block>;

// One line of an ```action block (or a question's `reveal:`). Script actions are the scripted-run
// commands (app/script.h); the others only lessons have.
struct LessonAction {
  enum Kind : uint8_t { Script, RunUntil, Inject, Scenario, Mark, Expect };
  Kind kind = Script;
  ScriptCommand script;                // Script
  Figure expr;                         // RunUntil (the condition), Expect
  GateKind by = GateKind::Collective;  // RunUntil: the gate it steps through
  Fault fault;                         // Inject
  std::vector<std::string> flags;      // Scenario: dtlab flags added to the header's
  std::string name;                    // Mark
  std::string text;                    // as written
  int line = 0;
};

struct Choice {
  std::string text;
  Figure value;  // `choice: TEXT = VALUE`; without one, its number (1 = first)
};

struct Question {
  int line = 0;
  std::string ask;
  Prose ask_prose;                   // the same, parsed (it may show {{figures}}, read when asked)
  std::vector<Choice> choices;       // empty: a numeric answer
  Figure answer;                     // the live figure revealed (read once, after the reveal actions)
  Figure expect;                     // optional: what the lesson claims the engine will reveal
  double tol_abs = -1, tol_rel = -1;  // `tolerance: 0.5` or `tolerance: 2%`; unset: exact for whole numbers, else 1%
  std::string unit;
  std::string topic;                 // `topic: NAME`: the lesson panel scores the answers per topic at the end
  std::vector<LessonAction> reveal;  // run before the answer is read
  Prose explain;                     // its figures are read with the answer, on the same snapshot
  // True when `given` counts as `live` under this question's tolerance.
  bool close(double given, double live) const;
  // A learner's answer as typed: "0.25", "1/4", "25%" (a share: 0.25; with `unit: %`, just 25),
  // "1,500", "3e9". False when it is not a number.
  bool parse_answer(const std::string& text, double& out) const;
  // The answer box's grey example, in the question's unit: "e.g. 4096 or 1.5e6" for bytes,
  // "e.g. 12" for counts, "e.g. 2.5" for times and sizes in GB; with no unit, as the question words
  // it: "0.25, 1/4 or 25%" for a share, "e.g. 2.5 or 5/2" for a ratio ("how many times"), "e.g. 12"
  // for a count ("how many").
  std::string answer_hint() const;
};

struct LessonStep {
  std::string title;
  int line = 0;
  Prose prose;
  std::vector<LessonAction> actions;  // run when the step is entered
  std::optional<Question> question;
};

struct Lesson {
  std::string name;   // "why_allreduce": the file's stem without its order number
  std::string path;   // as opened: "lessons/03_why_allreduce.md"
  std::string title, summary;
  int minutes = 0;
  std::vector<std::string> flags;  // the scenario, as dtlab flags
  std::vector<int> flag_lines;     // per flag: the header line it came from
  std::vector<LessonStep> steps;
  std::vector<Figure> figures;     // every {{...}} in prose and explanations
  // `draw: NAME = A | B | C` header lines: one value per name, drawn from `seed` when the lesson is
  // read, stands for ${NAME} in the rest of the file (${seed}: the seed). Empty, and seed 0, when
  // the lesson draws nothing.
  std::vector<std::pair<std::string, std::string>> draws;
  uint64_t seed = 0;
};

// Parses a lesson; throws LessonError naming `path` and the line. A lesson with `draw:` lines draws
// its values from `seed`, or from a fresh random seed (1 to 999999) when none is given.
Lesson parse_lesson(const std::string& text, const std::string& path, std::optional<uint64_t> seed = std::nullopt);
// NAME (lessons/NAME.md or lessons/NN_NAME.md) or a path to a .md file. Throws LessonError.
Lesson load_lesson(const std::string& name_or_path, std::optional<uint64_t> seed = std::nullopt);

// $DTLAB_LESSONS, else the source tree's lessons/.
std::string lessons_dir();
// The lesson files of a directory in course order (README.md left out).
std::vector<std::string> lesson_paths(const std::string& dir);
// "lessons/03_why_allreduce.md" -> "why_allreduce".
std::string lesson_name(const std::string& path);

// The scenario with `extra` flags after the header's, parsed exactly as dtlab parses its command
// line. Throws LessonError at the line of the flag the error names (else the header's).
AppOptions lesson_options(const Lesson& lesson, const std::vector<std::string>& extra = {}, int extra_line = 0);

// Markdown lines (each with its file line) to blocks, through md4c; every {{expr}} is parsed into
// lesson.figures. Throws LessonError at the line of a bad {{...}}.
Prose parse_prose(const std::vector<std::pair<int, std::string>>& lines, Lesson& lesson);

// One action line; throws dtlab::Error with the sentence (no file or line).
LessonAction parse_lesson_action(const std::string& text);

// What `lesson ARG` accepts in a script: "" when fine, else why not.
std::string check_lesson_command(const std::string& arg);

}  // namespace dtlab::app
