#include "app/script_runner.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>

#include "app/options.h"
#include "engine/core/format.h"

namespace dtlab::app {

namespace {

// How long a step, a pause or the end of `run N s` may take to come to rest at a gate.
constexpr std::chrono::seconds kSettleLimit{20};

std::chrono::steady_clock::time_point deadline_in(double seconds) {
  using Clock = std::chrono::steady_clock;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// The gate a step command steps to; none for the other commands.
std::optional<GateKind> gate_of(ScriptCommand::Kind kind) {
  switch (kind) {
    case ScriptCommand::StepRing: return GateKind::RingStep;
    case ScriptCommand::StepCollective: return GateKind::Collective;
    case ScriptCommand::StepIteration: return GateKind::Iteration;
    case ScriptCommand::StepAction: return GateKind::Action;
    case ScriptCommand::StepLayer: return GateKind::Layer;
    case ScriptCommand::StepBucket: return GateKind::Grad;
    default: return std::nullopt;
  }
}

}  // namespace

void ScriptRunner::start(const std::vector<ScriptCommand>& script, bool scripted) {
  queue_.assign(script.begin(), script.end());
  scripted_ = scripted;
}

void ScriptRunner::queue_lesson(const std::string& command) {
  ScriptCommand c;
  c.kind = ScriptCommand::Lesson;
  c.arg = command;
  queue_.push_back(c);
}

std::string ScriptRunner::where() const {
  return lessons_.runner() ? lessons_.runner()->lesson().path + ":" : "script command ";
}

bool ScriptRunner::tick() {
  if (spoilers_)
    for (const std::string& why : spoilers_->check(lessons_.runner())) {
      outcome_.exit_code = std::max(outcome_.exit_code, 1);
      lessons_.set_error(why);
    }
  if (shots_.pending()) return true;  // the screenshot is taken at the end of a frame
  const TraceViewer::WaitTick trace_wait = traces_.tick_wait();
  if (trace_wait.waiting) return true;
  if (!trace_wait.timeout.empty()) failure(trace_wait.line, trace_wait.timeout);
  if (trace_wait.failed_load) outcome_.exit_code = std::max(outcome_.exit_code, 2);
  if (waiting_) {
    if (Clock::now() < until_) return true;
    waiting_ = false;
    if (running_) {  // `run N s` is over: pause, and go on once the world is still (or after the limit)
      running_ = false;
      session_->pause();
      settle_ = Settle{};
      settle_.active = true;
      settle_.report = false;
      settle_.wait.start(kSettleLimit);
    }
  }
  if (settle_.active) {
    bool ok = true;
    if (poll_settle(ok)) return true;
    if (!ok) return !scripted_;
    if (settle_.report) return true;  // a step command is complete: the next command next frame
  }
  if (queue_.empty()) return !scripted_;  // a script ends the app when it runs out
  const ScriptCommand c = queue_.front();
  queue_.pop_front();
  return run(c);
}

bool ScriptRunner::poll_settle(bool& ok) {
  switch (settle_.wait.poll(*session_)) {
    case SettleWait::Waiting: return true;
    case SettleWait::TimedOut:
      settle_.active = false;
      if (settle_.report) ok = settle_failure();
      return false;
    case SettleWait::Settled: break;
  }
  if (settle_.done < settle_.count) {
    if (session_->finished()) {  // nothing left to step: say so once, instead of stepping nothing c.count times
      // (Counted in the command's moves, each to the next gate of its kind: the first reaches the run's first.)
      std::fprintf(stderr, "dtlab: %s%d: the run %s at move %d of the %d asked for (each to the next %s); the rest do nothing\n",
                   where().c_str(), settle_.cmd.line, session_->update().error.empty() ? "finished" : "failed", settle_.done, settle_.count,
                   gate_kind_name(settle_.kind));
      settle_.done = settle_.count;
    } else {
      session_->step(settle_.kind);
      settle_.done++;
    }
    settle_.wait.start(kSettleLimit);
    return true;
  }
  settle_.active = false;
  return false;
}

// The ranks did not come to rest: what the step waited for, the ranks not at a gate, and what each
// is doing. Ends a scripted run (exit 1); interactively the lesson panel shows it.
bool ScriptRunner::settle_failure() {
  const Snapshot& s = session_->update();
  const StepperState& st = s.stepper;
  std::string busy;
  for (int r = 0; r < static_cast<int>(s.compute_activity.size()); r++) {
    const size_t lane = static_cast<size_t>(r) * kStepperLanes;
    if (lane < st.gates.size() && st.gates[lane].blocked) continue;
    if (static_cast<size_t>(r) < st.live.size() && !st.live[static_cast<size_t>(r)]) continue;
    busy += (busy.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " " + s.compute_activity[static_cast<size_t>(r)];
    if (static_cast<size_t>(r) < s.comm_activity.size() && s.comm_activity[static_cast<size_t>(r)] != "idle")
      busy += ", its comm worker " + s.comm_activity[static_cast<size_t>(r)];
  }
  const std::string why = where() + std::to_string(settle_.cmd.line) + ": the ranks did not come to rest at a gate within 20 s" +
                          (st.waiting.empty() ? std::string() : " (" + st.waiting + ")") +
                          (busy.empty() ? std::string() : " (still running: " + busy + ")");
  std::fprintf(stderr, "dtlab: %s\n", why.c_str());
  if (scripted_) outcome_.exit_code = std::max(outcome_.exit_code, 1);
  lessons_.set_error(why);
  queue_.clear();
  return false;
}

// A script command that cannot do what it says: one sentence, and a scripted run ends with exit 1
// (exit 2: `code` 2, the command itself is bad input for this run, as a rank it does not have).
bool ScriptRunner::failure(int line, const std::string& why, int code) {
  std::fprintf(stderr, "dtlab: script command %d: %s\n", line, tidy_sentence(why).c_str());
  outcome_.exit_code = std::max(outcome_.exit_code, code);
  queue_.clear();
  return !scripted_;
}

void ScriptRunner::wait_for(double seconds, bool running) {
  waiting_ = true;
  running_ = running;
  until_ = deadline_in(seconds);
}

// One command; a step, a pause or a timed run starts a state the following frames poll.
bool ScriptRunner::run(const ScriptCommand& c) {
  // The trace viewer takes the trace commands, and every command when no run is beside it (a
  // lesson reading a trace keeps its Session for the lesson's commands).
  if (traces_.active() && (!session_ || trace_command(c) || c.kind == ScriptCommand::View)) return run_on_traces(c);
  auto start_settle = [&](GateKind k, int count) {
    settle_ = Settle{};
    settle_.active = true;
    settle_.cmd = c;
    settle_.kind = k;
    settle_.count = count;
    settle_.wait.start(kSettleLimit);
  };
  if (const std::optional<GateKind> k = gate_of(c.kind)) {
    if (!session_->paused()) session_->pause();
    start_settle(*k, c.count);  // each step once the world is still, then still again
    return true;
  }
  switch (c.kind) {
    case ScriptCommand::Focus:
      if (c.count >= session_->config().world_size)
        return failure(c.line, "focus rank " + std::to_string(c.count) + " is not a rank of this world of " +
                                   std::to_string(session_->config().world_size) + "; ranks are 0 to " +
                                   std::to_string(session_->config().world_size - 1),
                       2);
      session_->set_focus(c.count, c.arg);
      break;
    case ScriptCommand::Run:
      session_->run(session_->speed());
      if (c.seconds > 0) wait_for(c.seconds, true);
      break;
    case ScriptCommand::Wait: wait_for(c.seconds, false); break;
    case ScriptCommand::Pause:
      session_->pause();
      start_settle(GateKind::Collective, 0);
      break;
    case ScriptCommand::Sizing: host_.set_sizing(c.arg); break;
    case ScriptCommand::Context: {
      const ModelSpec& m = session_->config().model;
      if (c.count >= 0 && !m.is_gpt())
        return failure(c.line, "context block " + std::to_string(c.count) + " names a GPT block, and this run trains " + m.str() +
                                   "; run a GPT (--model gpt-tiny --cp 2) or drop the command",
                       2);
      if (c.count >= m.gpt.layers)
        return failure(c.line, "context block " + std::to_string(c.count) + " is not a block of this GPT of " + std::to_string(m.gpt.layers) +
                                   "; blocks are 0 to " + std::to_string(m.gpt.layers - 1),
                       2);
      host_.set_context_block(c.count, c.arg == "backward");
      break;
    }
    case ScriptCommand::View:
      if (trace_command(c)) return failure(c.line, "view " + c.arg + " is a panel of imported traces; open them with dtlab --open DIR");
      host_.show_view(c.arg);
      break;
    case ScriptCommand::Screenshot:
      if (const std::string why = screenshot_path_problem(c.arg, "screenshot"); !why.empty()) return failure(c.line, why, 2);
      shots_.request(c.arg, 3);  // let the layout and the views' render targets settle first
      break;
    case ScriptCommand::CheckLayout: shots_.request_layout_check(3); break;
    case ScriptCommand::Speed: {
      const bool was_paused = session_->paused();
      session_->run(c.value);
      if (was_paused) session_->pause();
      break;
    }
    case ScriptCommand::Presentation: host_.set_presentation(c.arg == "on"); break;
    case ScriptCommand::FullScreen: host_.set_fullscreen(c.arg == "on"); break;
    case ScriptCommand::StartScreen: {
      host_.start_screen(c.arg);
      StartScenario sc{};
      if (parse_start_scenario(c.arg, sc)) start_settle(GateKind::Iteration, start_scenario_iterations(sc));
      break;
    }
    case ScriptCommand::Clock: host_.set_modeled_clock(c.arg == "modeled"); break;
    case ScriptCommand::Colour: host_.set_peak_colours(c.arg == "peak"); break;
    case ScriptCommand::SetEpoch: host_.set_data_set_epoch(c.arg == "on"); break;
    case ScriptCommand::Generate:
      if (const std::string why = host_.generate_text(c.arg); !why.empty()) return failure(c.line, why, 2);
      break;
    case ScriptCommand::Reset: host_.restart(session_->config()); break;
    case ScriptCommand::Pin:
      if (const std::string why = host_.pin_run(); !why.empty()) return failure(c.line, why, 2);
      break;
    case ScriptCommand::Unpin: host_.unpin_run(); break;
    case ScriptCommand::CompareRun: {
      std::vector<std::string> flags;
      std::istringstream is(c.arg);
      for (std::string w; is >> w;) flags.push_back(w);
      if (const std::string why = host_.compare_run(flags); !why.empty()) return failure(c.line, why, 2);
      // B starts where A's run started: paused, or running on.
      break;
    }
    case ScriptCommand::Quit: return false;
    case ScriptCommand::Lesson: return lesson_command(c);
    case ScriptCommand::WaitFor:
    case ScriptCommand::Select:
    case ScriptCommand::Compare:
    case ScriptCommand::Zoom:  // options.cpp refuses these without --open; a lesson's actions come here
      return failure(c.line, "this command works on imported traces; open them with dtlab --open DIR");
    default: break;  // the step commands, above
  }
  return true;
}

// The commands a script may give the trace viewer (options.cpp refused the live-run ones).
bool ScriptRunner::run_on_traces(const ScriptCommand& c) {
  switch (c.kind) {
    case ScriptCommand::Wait: wait_for(c.seconds, false); return true;
    case ScriptCommand::View: host_.show_view(c.arg); return true;
    case ScriptCommand::Screenshot: shots_.request(c.arg, 3); return true;
    case ScriptCommand::CheckLayout: shots_.request_layout_check(3); return true;
    case ScriptCommand::Presentation: host_.set_presentation(c.arg == "on"); return true;
    case ScriptCommand::FullScreen: host_.set_fullscreen(c.arg == "on"); return true;
    case ScriptCommand::Quit: return false;
    default: break;
  }
  if (const std::string why = traces_.script(c); !why.empty()) return failure(c.line, why);
  return true;
}

void ScriptRunner::open_lesson(const std::string& name) {
  host_.lesson_opened();
  if (!lessons_.open(name)) {  // the panel shows the sentence; the app goes on
    lesson_failed_ = true;
    std::fprintf(stderr, "dtlab: %s\n", tidy_sentence(lessons_.error()).c_str());
    if (scripted_) outcome_.exit_code = 2;  // the script goes on (a screenshot shows the panel), and fails at the end
    if (play_) outcome_.quit = true;
    return;
  }
  lesson_failed_ = false;
  ScriptCommand c;
  c.kind = ScriptCommand::Lesson;
  c.arg = play_ ? "play" : "start";
  queue_.push_front(c);
}

// `lesson ...`: open and close here, the rest in the lesson's runner, whose follow-up commands run
// before anything else queued. A failure ends a scripted run (exit 1); interactively the panel
// shows it.
bool ScriptRunner::lesson_command(const ScriptCommand& c) {
  if (c.arg.rfind("open ", 0) == 0) {
    open_lesson(c.arg.substr(5));
    return !outcome_.quit;
  }
  if (c.arg == "close") {
    lessons_.close();
    return true;
  }
  if (spoilers_ && lessons_.runner() && c.arg.rfind("_precheck ", 0) == 0) {
    // Draw one frame of the step as the learner sees it when checking, read it; then the reveal's
    // actions run (a view they open shows the answer after the check, not before).
    if (spoilers_->capture_before(std::atoi(c.arg.c_str() + 10))) {
      queue_.push_front(c);
      return true;
    }
  }
  LessonRunner::Result r;
  if (LessonRunner* lesson = lessons_.runner()) r = lesson->exec(c.arg, *session_);
  else if (lesson_failed_) return true;  // its open failed, which said so once: no sentence per command after it
  else r.failure = "lesson " + c.arg + ": no lesson is open; open one first (lesson open NAME)", r.code = 2;
  host_.lesson_ran();
  if (!r.failure.empty()) {
    std::fprintf(stderr, "dtlab: %s\n", r.failure.c_str());
    lessons_.set_error(r.failure);
    queue_.clear();
    if (scripted_) outcome_.exit_code = std::max(outcome_.exit_code, r.code);
    return !scripted_;
  }
  if (r.again) queue_.push_front(c);
  queue_.insert(queue_.begin(), r.then.begin(), r.then.end());
  return true;
}

}  // namespace dtlab::app
