// The lesson panel: the course's lessons with each one's progress, or the open lesson's step (its
// prose, its question, the engine's revealed answer and the explanation) with Back and Next. It
// draws from the runner and the Snapshot and returns what the user asked for as a lesson command;
// the app queues it like a script's, so the panel never drives the engine itself.
#pragma once
#include <array>
#include <map>
#include <string>
#include <vector>

#include "app/lesson_host.h"
#include "app/lesson_runner.h"
#include "app/views/views.h"

namespace dtlab::app {

struct LessonPanel {
  LessonRunner* runner = nullptr;          // the open lesson, or null: the list
  const LessonCatalog* catalog = nullptr;  // the list, as the lesson host last read it
  std::string error;                       // a lesson file that does not parse, or a step that failed
  bool busy = false;                       // lesson commands are still running
};

// What the panel keeps between frames, which the app owns.
struct LessonViewState {
  // The answer being typed, per lesson step ("PATH#STEP"), until Check sends it.
  std::map<std::string, std::array<char, 64>> typed;
};

// Draws into the current window; returns the commands for `lesson ...` the user asked for, in order
// ("open why_allreduce", "answer 2", "check", "next").
std::vector<std::string> draw_lesson_view(const LessonPanel& panel, LessonViewState& view, const Snapshot& s, ViewContext& ctx);

}  // namespace dtlab::app
