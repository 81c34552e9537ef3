// The lesson panel: the course's lessons with each one's progress, or the open lesson's step (its
// prose, its question, the engine's revealed answer and the explanation) with Back and Next. It
// draws from the runner and the Snapshot and returns what the user asked for as a lesson command;
// the app queues it like a script's, so the panel never drives the engine itself.
#pragma once
#include <string>
#include <vector>

#include "app/lesson_runner.h"
#include "app/views/views.h"

namespace dtlab::app {

struct LessonPanel {
  LessonRunner* runner = nullptr;  // the open lesson, or null: the list
  std::string error;               // a lesson file that does not parse, or a step that failed
  bool busy = false;               // lesson commands are still running
};

// Draws into the current window; returns the commands for `lesson ...` the user asked for, in order
// ("open why_allreduce", "answer 2", "check", "next").
std::vector<std::string> draw_lesson_view(const LessonPanel& panel, const Snapshot& s, ViewContext& ctx);

}  // namespace dtlab::app
