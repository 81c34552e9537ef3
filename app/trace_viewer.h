// The imported-trace viewer's state: the loader (dtlab --open, or a lesson whose scenario opens
// traces), this frame's snapshot of it, what its panels share (TraceUi), and the script commands
// that work on traces (wait trace|compare, select, zoom, compare). The app lays its panels out and
// draws them (app/views/trace_view.cpp); the script runner hands it the trace commands.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "app/lesson_runner.h"
#include "app/options.h"
#include "app/script.h"
#include "app/session.h"
#include "app/trace_loader.h"
#include "app/views/views.h"

namespace dtlab::app {

class TraceViewer {
 public:
  // --open: the viewer with no run beside it; the Compare panel's choices come from the options.
  // load() starts reading the files (once the window is open).
  void create(const AppOptions& o);
  void load(const std::vector<std::string>& paths, const std::vector<int>& ranks);
  void close() { loader_.reset(); }  // cancels a load and joins its threads
  bool active() const { return loader_ != nullptr; }

  // Once a frame before drawing; snapshot() is that frame's view until the next poll.
  void poll();
  const TraceSnapshot& snapshot() const { return *snap_; }
  TraceUi& ui() { return ui_; }
  bool loading() { return loader_ && loader_->poll().load == TaskState::Running; }
  // The loaded trace for a Session's figures (trace.*), aliased so it lives as long as the loader's
  // copy; null until loaded.
  std::shared_ptr<const ImportedTrace> loaded() const;

  // A lesson whose scenario opens traces (`open:`): loads them beside the lesson's Session, or
  // closes them when the scenario opens none. True when it opened traces (the panels' tiles change).
  bool sync_lesson(const LessonRunner* lesson, Session& session);

  // The toolbar's buttons, and after the panels drew, what they asked for (cancel, reload, compare).
  void cancel() { loader_->cancel(); }
  void reopen() { loader_->reopen(); }
  void after_draw();

  // What a screenshot of the panels shows, in words.
  std::string state_text() const;

  // wait trace|compare, select, zoom, compare: "" when done, else the sentence saying why not.
  std::string script(const ScriptCommand& c);
  // A `wait trace|compare` in progress, polled once a frame. When the task ends the outcome is
  // printed; a failed load is what the panels show, so the script goes on (`failed_load`: the run
  // ends with exit 2). `timeout`: the limit passed, one sentence.
  struct WaitTick {
    bool waiting = false;
    bool failed_load = false;
    std::string timeout;
    int line = 0;  // the wait's script line, for the timeout's sentence
  };
  WaitTick tick_wait();

 private:
  using Clock = std::chrono::steady_clock;
  std::unique_ptr<TraceLoader> loader_;
  const TraceSnapshot* snap_ = nullptr;
  TraceUi ui_;
  std::vector<std::string> lesson_traces_;  // what the lesson's scenario opened
  bool waiting_ = false;                    // a `wait trace|compare` in progress
  ScriptCommand wait_;
  Clock::time_point wait_until_{};
};

}  // namespace dtlab::app
