// Feeds the bytes, as a lesson's Markdown text, to parse_lesson (app/lesson.h): the header, its
// scenario (through dtlab's own option parser), steps, action and question blocks, live figures and
// the md4c prose. Finding: anything but dtlab::Error (LessonError is one), or an accepted lesson
// whose scenario set a flag about the window (lessons/README.md: those are refused) or whose prose
// points at a figure that is not there.
#include "app/lesson.h"
#include "fuzz/fuzz_util.h"

using namespace dtlab;
using namespace dtlab::app;

namespace {

void check_prose(const Prose& prose, const Lesson& l) {
  auto check_spans = [&](const std::vector<Span>& spans) {
    for (const Span& s : spans)
      fuzz::require(s.figure < static_cast<int>(l.figures.size()), "a span names a figure the lesson does not hold");
  };
  for (const Block& b : prose) {
    check_spans(b.spans);
    for (const std::vector<Span>& cell : b.cells) check_spans(cell);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Lesson l;
  if (!fuzz::accepts([&] { l = parse_lesson(text, "lessons/99_fuzz.md"); })) return 0;
  fuzz::require(!l.title.empty() && l.minutes >= 1 && l.minutes <= 60 && !l.steps.empty(), "an accepted lesson lacks its header or steps");
  fuzz::require(l.flags.size() == l.flag_lines.size(), "a scenario flag without its line");
  const AppOptions o = lesson_options(l);  // parse_lesson checked the scenario: this must not throw
  const AppOptions plain;
  fuzz::require(o.script.empty() && o.screenshot.empty() && o.frames == plain.frames && o.bench_frames == 0 &&
                    !o.presentation && !o.running && o.speed == plain.speed && o.width == plain.width &&
                    o.height == plain.height && o.config_dir.empty() && o.lesson.empty() && !o.play,
                "the lesson's scenario set a flag about the window, which lessons refuse");
  for (const LessonStep& s : l.steps) {
    check_prose(s.prose, l);
    if (s.question) {
      check_prose(s.question->ask_prose, l);
      check_prose(s.question->explain, l);
      fuzz::require(!s.question->answer.empty() && s.question->choices.size() != 1, "an accepted question without its answer");
    }
  }
  return 0;
}
