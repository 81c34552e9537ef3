// Runs scripted commands (--run, --script, --play) and what lessons, the lesson panel and the
// presenter's N key queue: one command at a time, the next once the previous one is complete.
// Nothing here holds a frame: a command that waits (for the world to come to rest after a step or
// a pause, for some seconds, for a trace to load) becomes a state that tick() polls once a frame
// and returns from at once; its time limit and the sentence saying what it waited for are those of
// the command.
#pragma once
#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "app/lesson_host.h"
#include "app/screenshots.h"
#include "app/script.h"
#include "app/session.h"
#include "app/trace_viewer.h"

namespace dtlab::app {

// How the app's run ends: its exit code so far, and whether to stop now.
struct AppOutcome {
  int exit_code = 0;
  bool quit = false;
};

class ScriptRunner {
 public:
  // What a script asks of the window; the app implements it.
  class Host {
   public:
    virtual ~Host() = default;
    virtual void show_view(const std::string& name) = 0;  // `view NAME`: one view alone, or "all"
    virtual void set_sizing(const std::string& spec) = 0;  // `sizing SPEC`: the Sizing view's settings, and the view alone; "run": its button
    // `context block L forward|backward`: the Context view shows that block's pass, and the view alone;
    // block -1: it follows the pass running now again.
    virtual void set_context_block(int block, bool backward) = 0;
    virtual void set_presentation(bool on) = 0;
    virtual void set_fullscreen(bool on) = 0;
    // The start screen: "on", "off", "course", or a scenario's word (parse_start_scenario), whose
    // run it starts paused; the runner then steps its iterations.
    virtual void start_screen(const std::string& what) = 0;
    virtual void set_modeled_clock(bool on) = 0;
    virtual void set_peak_colours(bool on) = 0;  // `colour peak`: the timeline's "% of peak"
    virtual void set_data_set_epoch(bool on) = 0;
    // `generate TEXT`: the data view's Generate box asks a GPT run to continue TEXT; "" or why not.
    virtual std::string generate_text(const std::string& prompt) = 0;
    virtual void restart(const TrainConfig& config) = 0;  // `reset`
    // A/B comparison: `pin`, `unpin`, and `compare FLAGS` (B's settings, A pinned first when none is).
    // An empty string, or the sentence saying why not.
    virtual std::string pin_run() = 0;
    virtual void unpin_run() = 0;
    virtual std::string compare_run(const std::vector<std::string>& flags) = 0;
    virtual void lesson_opened() = 0;                     // its panel shows
    // A lesson command ran: it may have restarted the run, and its scenario may open traces.
    virtual void lesson_ran() = 0;
  };
  // `session`: null for the trace viewer alone (dtlab --open). `spoilers`: --check-spoilers, else null.
  ScriptRunner(Host& host, Session* session, LessonHost& lessons, TraceViewer& traces, Screenshots& shots, SpoilerCheck* spoilers,
               AppOutcome& outcome, bool play)
      : host_(host), session_(session), lessons_(lessons), traces_(traces), shots_(shots), spoilers_(spoilers), outcome_(outcome),
        play_(play) {}

  // The script's commands; scripted (--run, --script, --play): the app ends when they run out.
  void start(const std::vector<ScriptCommand>& script, bool scripted);
  bool scripted() const { return scripted_; }
  void push_front(const ScriptCommand& c) { queue_.push_front(c); }
  // `lesson COMMAND` after what is queued (the lesson panel, the N key).
  void queue_lesson(const std::string& command);
  // Commands queued or one still waiting: the lesson panel's buttons wait too.
  bool busy() const { return !queue_.empty() || settle_.active || waiting_; }

  // Once a frame, after it was drawn: polls what the current command waits for, else runs the
  // next one. False when the app is to end.
  bool tick();

 private:
  using Clock = std::chrono::steady_clock;
  bool run(const ScriptCommand& c);
  bool run_on_traces(const ScriptCommand& c);
  bool lesson_command(const ScriptCommand& c);
  void open_lesson(const std::string& name);
  bool failure(int line, const std::string& why, int code = 1);
  bool settle_failure();
  // Polls a step command (or pause, or the end of `run N s`): the world coming to rest, then the
  // next step. True while it still runs; `ok` false when the app is to end.
  bool poll_settle(bool& ok);
  void wait_for(double seconds, bool running);  // `wait N s`; `run N s` (running: pause at the end)
  std::string where() const;              // "lessons/x.md:" or "script command "

  Host& host_;
  Session* session_;
  LessonHost& lessons_;
  TraceViewer& traces_;
  Screenshots& shots_;
  SpoilerCheck* spoilers_;
  AppOutcome& outcome_;
  bool play_ = false;
  std::deque<ScriptCommand> queue_;
  bool scripted_ = false;
  bool lesson_failed_ = false;  // the last `lesson open` (or --lesson) failed: the lesson commands after it are moot
  // `wait N s` and `run N s` (running: pause when the time is up)
  bool waiting_ = false, running_ = false;
  Clock::time_point until_{};
  // A step command in progress: each step once the world is still, then the world still again.
  struct Settle {
    bool active = false;
    bool report = true;  // a timeout is a failure (not after `run N s`, which pauses and goes on)
    ScriptCommand cmd;
    GateKind kind = GateKind::Collective;
    int done = 0, count = 0;
    SettleWait wait;
  } settle_;
};

}  // namespace dtlab::app
