#include "app/lesson_runner.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "app/text.h"
#include "engine/io/atomic_file.h"

namespace dtlab::app {

namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr int kMaxUntilSteps = 2000;   // gates a `run until` may step through
constexpr double kFreeRunAfter_s = 1.5;  // not still at a gate this long: the world hangs; let it run
constexpr double kMaxUntil_s = 90;       // and give up after this long

ScriptCommand lesson_cmd(const std::string& arg, int line = 0) {
  ScriptCommand c;
  c.kind = ScriptCommand::Lesson;
  c.arg = arg;
  c.line = line;
  return c;
}

std::string fault_flag(const Fault& f) {
  char buf[128];
  if (f.kind == FaultKind::Skip)
    std::snprintf(buf, sizeof buf, "skip:rank=%d,collective=%llu", f.rank, static_cast<unsigned long long>(f.seq));
  else
    std::snprintf(buf, sizeof buf, "delay:rank=%d,collective=%llu,ms=%lld", f.rank, static_cast<unsigned long long>(f.seq),
                  static_cast<long long>(f.delay_s * 1000 + 0.5));
  return buf;
}

// A figure's value as the lesson panel prints it; "—" while it has none.
std::string figure_value(const Figure& f, const FigureScope& scope) {
  try {
    return format_figure(f.eval(scope));
  } catch (const std::exception&) {
    return "—";
  }
}

// The {{figures}} a piece of prose shows, by index into Lesson::figures.
std::vector<int> figures_in(const Prose& prose) {
  std::vector<int> out;
  auto add = [&](const std::vector<Span>& spans) {
    for (const Span& sp : spans)
      if (sp.figure >= 0) out.push_back(sp.figure);
  };
  for (const Block& b : prose) {
    add(b.spans);
    for (const auto& cell : b.cells) add(cell);
  }
  return out;
}

}  // namespace

// ---- progress.json ----

std::string progress_path() {
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x) return std::string(x) + "/dtlab/progress.json";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.local/state/dtlab/progress.json";
  return {};
}

std::map<std::string, LessonProgress> load_progress(const std::string& path) {
  std::map<std::string, LessonProgress> out;
  std::ifstream f(path);
  if (!f) return out;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    for (const auto& [name, v] : j.at("lessons").items())
      out[name] = LessonProgress{v.value("step", 0), v.value("steps", 0), v.value("answered", 0), v.value("correct", 0),
                                 v.value("completed", false)};
  } catch (const std::exception&) {
    out.clear();  // a damaged file is ignored (and replaced on the next save)
  }
  return out;
}

void save_progress(const std::string& path, const std::string& lesson, const LessonProgress& p) {
  nlohmann::json j = {{"version", 1}, {"lessons", nlohmann::json::object()}};
  for (const auto& [name, q] : load_progress(path))
    j["lessons"][name] = {{"step", q.step}, {"steps", q.steps}, {"answered", q.answered}, {"correct", q.correct}, {"completed", q.completed}};
  j["lessons"][lesson] = {{"step", p.step}, {"steps", p.steps}, {"answered", p.answered}, {"correct", p.correct}, {"completed", p.completed}};
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string text = j.dump(2) + "\n";
  AtomicFile f(path);
  f.write(text.data(), text.size());
  f.commit();
}

// ---- the runner ----

LessonRunner::LessonRunner(Lesson lesson, bool play, std::string progress_file)
    : lesson_(std::move(lesson)), play_(play), progress_file_(std::move(progress_file)) {
  answers_.resize(lesson_.steps.size());
  question_of_.assign(lesson_.figures.size(), -1);
  if (play_ && !lesson_.draws.empty()) {  // what this play drew, so that a failure can be replayed
    std::string drawn;
    for (const auto& [name, value] : lesson_.draws) drawn += (drawn.empty() ? "" : ", ") + name + " = " + value;
    std::printf("lesson %s: seed %llu (replay with --seed %llu): %s\n", lesson_.name.c_str(),
                static_cast<unsigned long long>(lesson_.seed), static_cast<unsigned long long>(lesson_.seed), drawn.c_str());
    std::fflush(stdout);
  }
  for (size_t j = 0; j < lesson_.steps.size(); j++) {
    const auto& q = lesson_.steps[j].question;
    if (!q) continue;
    for (const Prose* p : {&q->ask_prose, &q->explain})
      for (int f : figures_in(*p)) question_of_.at(static_cast<size_t>(f)) = static_cast<int>(j);
  }
  if (!progress_file_.empty() && !play_) {
    auto all = load_progress(progress_file_);
    if (auto it = all.find(lesson_.name); it != all.end()) resume_ = it->second;
  }
}

std::string LessonRunner::where(int step, int line) const {
  std::string w = lesson_.path + ":" + std::to_string(line) + ": ";
  if (!lesson_.draws.empty()) w += "(seed " + std::to_string(lesson_.seed) + ") ";  // --seed N replays the draw
  if (step >= 0 && step < steps())
    w += "step " + std::to_string(step + 1) + " '" + lesson_.steps[static_cast<size_t>(step)].title + "': ";
  return w;
}

// Script actions go to the app as they are (a step is guarded: it must not run on a failed run);
// the lesson's own actions come back here as `_act STEP TAG INDEX` (tag a: the step's, r: a reveal's).
void LessonRunner::actions(const std::vector<LessonAction>& acts, int step, char tag, std::vector<ScriptCommand>& out) const {
  for (size_t i = 0; i < acts.size(); i++) {
    const std::string key = std::to_string(step) + " " + tag + " " + std::to_string(i);
    if (acts[i].kind != LessonAction::Script) {
      out.push_back(lesson_cmd("_act " + key, acts[i].line));
      continue;
    }
    const ScriptCommand::Kind k = acts[i].script.kind;
    if (k == ScriptCommand::StepRing || k == ScriptCommand::StepCollective || k == ScriptCommand::StepIteration ||
        k == ScriptCommand::StepLayer || k == ScriptCommand::StepBucket)
      out.push_back(lesson_cmd("_guard " + key, acts[i].line));
    out.push_back(acts[i].script);
    out.back().line = acts[i].line;
  }
}

LessonRunner::Result LessonRunner::apply_scenario(Session& session, int step, int line) {
  Result r;
  try {
    AppOptions o = lesson_options(lesson_, extra_, line);
    trace_scenario_ = TraceScenario{o.open, o.trace_ranks, o.trace_model, o.compare_profile, o.trace_batch, o.trace_bucket_cap_mb,
                                    o.trace_first_bucket_mb};
    session.restart(o.train);
    session.pause();
    session.update();
    ScriptCommand clock;
    clock.kind = ScriptCommand::Clock;
    clock.arg = o.modeled_clock ? "modeled" : "wall";
    r.then.push_back(clock);
  } catch (const LessonError& e) {
    r.failure = e.what(), r.code = 2;
  } catch (const Error& e) {
    r.failure = where(step, line) + "the scenario does not start: " + e.what(), r.code = 2;
  }
  return r;
}

LessonRunner::Result LessonRunner::act(const LessonAction& a, int step, const std::string& key, Session& session) {
  Result r;
  const std::string at = where(step, a.line) + "'" + a.text + "': ";
  switch (a.kind) {
    case LessonAction::Script: break;
    case LessonAction::Inject:
      extra_.push_back("--fault");
      extra_.push_back(fault_flag(a.fault));
      return apply_scenario(session, step, a.line);
    case LessonAction::Scenario:
      extra_ = a.flags;
      return apply_scenario(session, step, a.line);
    case LessonAction::Mark: marks_[a.name] = session.update(); break;
    case LessonAction::Expect: {
      const FigureScope scope{&session.update(), &marks_};
      try {
        if (a.expr.eval(scope) == 0) r.failure = at + "this does not hold: " + a.expr.explain(scope);
      } catch (const Error& e) {  // the lesson asks for a figure that has no value: its text is at fault
        r.failure = at + e.what(), r.code = 2;
      }
      break;
    }
    case LessonAction::RunUntil: {
      const auto now = SteadyClock::now();
      if (until_.key != key) until_ = Until{key, 0, false, now, now, SettleWait{}, false};
      // The world settling after a step (or after the pause once the condition held): asked once a
      // frame, never waited for here.
      if (until_.settle.active()) {
        const SettleWait::State settled = until_.settle.poll(session);
        if (settled == SettleWait::Waiting) {
          r.again = true;
          break;
        }
        if (until_.held) {
          until_.key.clear();
          break;
        }
        if (settled == SettleWait::Settled) until_.last_still = SteadyClock::now();
      }
      // Asked before the snapshot is taken: a run that ended by then shows how it ended (its error
      // is set before it counts as finished). Asked after, a run that failed in between read as
      // "finished before this held" with a snapshot from before the failure (seen under load).
      const bool ended = session.finished();
      const Snapshot& s = session.update();
      const FigureScope scope{&s, &marks_};
      bool holds = false;
      try {
        holds = a.expr.eval(scope) != 0;
      } catch (const Error&) {  // e.g. bucket[2] before the buckets exist: not yet
      }
      const double waited = std::chrono::duration<double>(now - until_.since).count();
      if (holds) {
        if (until_.free) {  // pause, and go on once the world is still again (or after 20 s)
          session.pause();
          until_.settle.start(std::chrono::seconds(20));
          until_.held = r.again = true;
          break;
        }
        until_.key.clear();
        break;
      }
      if (!s.error.empty() || ended) {
        r.failure = at + "the run " + (s.error.empty() ? "finished" : "failed (" + s.error + ")") + " before this held";
      } else if (!until_.free) {
        if (session.settled()) {
          if (++until_.steps > kMaxUntilSteps) {
            r.failure = at + "this did not hold within " + std::to_string(kMaxUntilSteps) + " steps: " + a.expr.explain(scope);
          } else {
            session.step(a.by);
            until_.settle.start(std::chrono::milliseconds(300));
          }
        } else if (std::chrono::duration<double>(now - until_.last_still).count() > kFreeRunAfter_s) {
          until_.free = true;  // a rank waits outside any gate (a hang): the watchdog needs the clock to run
          session.run(0);
        }
      } else if (waited > kMaxUntil_s) {
        r.failure = at + "this did not hold within " + std::to_string(static_cast<int>(kMaxUntil_s)) + " s: " + a.expr.explain(scope);
      }
      if (r.failure.empty()) r.again = true;
      else until_.key.clear();
      break;
    }
  }
  return r;
}

std::vector<std::string> LessonRunner::pending_figures() const {
  if (step_ < 0 || step_ >= steps() || finished_) return {};
  const auto& q = lesson_.steps[static_cast<size_t>(step_)].question;
  if (!q || answers_[static_cast<size_t>(step_)].revealed) return {};
  std::vector<std::string> names = q->answer.names();
  for (const Choice& c : q->choices)
    for (const std::string& n : c.value.names()) names.push_back(n);
  return names;
}

void LessonRunner::freeze(int j, const Prose& prose, const FigureScope& scope) {
  Answer& a = answers_.at(static_cast<size_t>(j));
  for (int f : figures_in(prose)) a.shown[f] = figure_value(lesson_.figures.at(static_cast<size_t>(f)), scope);
}

// The step's actions have run: the question is asked now, and its text keeps these figures.
void LessonRunner::ask(int j, Session& session) {
  freeze(j, lesson_.steps.at(static_cast<size_t>(j)).question->ask_prose, FigureScope{&session.update(), &marks_});
  answers_[static_cast<size_t>(j)].asked = true;
}

std::vector<LessonRunner::TopicScore> LessonRunner::topic_scores() const {
  std::vector<TopicScore> out;
  for (size_t j = 0; j < lesson_.steps.size(); j++) {
    const std::optional<Question>& q = lesson_.steps[j].question;
    if (!q || q->topic.empty()) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const TopicScore& t) { return t.topic == q->topic; });
    if (it == out.end()) it = out.insert(out.end(), TopicScore{q->topic});
    it->questions++;
    it->checked += answers_[j].checked ? 1 : 0;
    it->correct += answers_[j].checked && answers_[j].correct ? 1 : 0;
  }
  return out;
}

void LessonRunner::grade(int j) {
  const Question& q = *lesson_.steps.at(static_cast<size_t>(j)).question;
  Answer& a = answers_.at(static_cast<size_t>(j));
  a.checked = a.given;
  a.correct = a.given && (q.choices.empty() ? q.close(a.number, a.live) : a.choice == a.live_choice);
}

LessonRunner::Result LessonRunner::reveal(int j, Session& session) {
  Result r;
  const LessonStep& st = lesson_.steps[static_cast<size_t>(j)];
  const Question& q = *st.question;
  Answer& a = answers_[static_cast<size_t>(j)];
  if (a.revealed) {  // read once: the run may have moved on since, and the answer speaks of then
    grade(j);
    save();
    return r;
  }
  const FigureScope scope{&session.update(), &marks_};
  const std::string at = where(j, q.line);
  double live = 0;
  try {
    live = q.answer.eval(scope);
  } catch (const Error& e) {
    r.failure = at + "the answer has no value: " + e.what(), r.code = 2;
    return r;
  }
  int live_choice = -1;
  for (size_t i = 0; i < q.choices.size() && live_choice < 0; i++) {
    try {
      if (q.close(q.choices[i].value.eval(scope), live)) live_choice = static_cast<int>(i);
    } catch (const Error& e) {
      r.failure = at + "choice " + std::to_string(i + 1) + ": " + e.what(), r.code = 2;
      return r;
    }
  }
  if (!q.choices.empty() && live_choice < 0) {
    r.failure = at + "the engine revealed " + q.answer.text() + " = " + format_figure(live) + ", which matches none of the choices";
    return r;
  }
  if (play_) {  // answer with what the engine shows
    a.given = true;
    a.number = live;
    a.choice = live_choice;
  }
  a.revealed = true;
  a.live = live;
  a.live_choice = live_choice;
  grade(j);
  freeze(j, q.explain, scope);  // on the snapshot the answer was read from
  a.note.clear();
  std::string expected;
  if (!q.expect.empty()) {
    try {
      const double e = q.expect.eval(scope);
      expected = " (the lesson expects " + q.expect.text() + " = " + format_figure(e) + ")";
      if (!q.close(e, live)) {
        a.note = at + "the engine revealed " + q.answer.text() + " = " + format_figure(live) + " but the lesson expects " +
                 q.expect.text() + " = " + format_figure(e);
        if (play_) r.failure = a.note;
        else std::fprintf(stderr, "dtlab: %s\n", a.note.c_str());
      }
    } catch (const Error& e) {
      r.failure = at + "expect: " + e.what(), r.code = 2;
    }
  }
  if (play_ && r.failure.empty()) {
    if (!a.correct) r.failure = at + "the live answer " + format_figure(live) + " was not accepted as correct";
    std::printf("lesson %s: step %d/%d '%s': %s = %s%s%s\n", lesson_.name.c_str(), j + 1, steps(), st.title.c_str(),
                q.answer.text().c_str(), answer_text(j).c_str(), expected.c_str(), r.failure.empty() ? ", ok" : "");
    std::fflush(stdout);
  }
  save();
  return r;
}

LessonRunner::Result LessonRunner::exec(const std::string& command, Session& session) {
  Result r;
  const std::vector<std::string> w = words(command);
  if (w.empty()) return r;
  const std::string& k = w[0];
  const int n = steps();
  // A step number, whole or not at all ("1e3" and "2abc" are no step): -1 where it is not one.
  auto arg = [&](size_t i) {
    int v = -1;
    if (i >= w.size()) return -1;
    const auto [end, ec] = std::from_chars(w[i].data(), w[i].data() + w[i].size(), v);
    return ec == std::errc() && end == w[i].data() + w[i].size() ? v : -1;
  };
  auto has_question = [&](int j) { return j >= 0 && j < n && lesson_.steps[static_cast<size_t>(j)].question.has_value(); };
  // Reveal a question that was left unanswered, so later steps see the engine where they expect it.
  auto settle_question = [&](int j) {
    if (has_question(j) && !answers_[static_cast<size_t>(j)].revealed) {
      if (!answers_[static_cast<size_t>(j)].asked) r.then.push_back(lesson_cmd("_ask " + std::to_string(j)));
      r.then.push_back(lesson_cmd("_precheck " + std::to_string(j)));  // the screen as the learner checks (--check-spoilers)
      actions(lesson_.steps[static_cast<size_t>(j)].question->reveal, j, 'r', r.then);
      r.then.push_back(lesson_cmd("_reveal " + std::to_string(j)));
    }
  };
  // Replay from the scenario to step `target` (index).
  auto replay_to = [&](int target) {
    for (Answer& a : answers_) {  // the engine starts over; the learner's answers stay
      a.asked = a.revealed = a.checked = a.correct = false;
      a.shown.clear();
    }
    finished_ = false;
    r.then.push_back(lesson_cmd("_restart"));
    for (int j = 0; j < target; j++) {
      r.then.push_back(lesson_cmd("_enter " + std::to_string(j)));
      r.then.push_back(lesson_cmd("_settle " + std::to_string(j)));
    }
    r.then.push_back(lesson_cmd("_enter " + std::to_string(target)));
  };

  if (k == "start") {
    marks_.clear();
    answers_.assign(static_cast<size_t>(n), Answer{});
    replay_to(0);
  } else if (k == "play") {
    play_ = true;
    marks_.clear();
    answers_.assign(static_cast<size_t>(n), Answer{});
    r.then.push_back(lesson_cmd("_restart"));
    for (int j = 0; j < n; j++) {
      r.then.push_back(lesson_cmd("_enter " + std::to_string(j)));
      r.then.push_back(lesson_cmd("_settle " + std::to_string(j)));
    }
    r.then.push_back(lesson_cmd("_done"));
  } else if (k == "next" || k == "demo") {
    if (step_ < 0) return exec("start", session);
    const Answer& a = answers_[static_cast<size_t>(step_)];
    if (k == "demo" && has_question(step_) && !a.revealed) {  // the presenter's N: reveal first, then move on
      settle_question(step_);
      return r;
    }
    settle_question(step_);
    r.then.push_back(lesson_cmd(step_ + 1 < n ? "_enter " + std::to_string(step_ + 1) : "_done"));
  } else if (k == "back") {
    if (step_ > 0) replay_to(step_ - 1);
  } else if (k == "goto") {
    // (The script's fault, not the lesson's: exit 2, as every bad input.)
    if (arg(1) < 1 || arg(1) > n) r.failure = lesson_.path + ": lesson goto " + w[1] + ": the lesson has steps 1 to " + std::to_string(n), r.code = 2;
    else replay_to(arg(1) - 1);
  } else if (k == "answer" || k == "check") {
    if (!has_question(step_)) {
      r.failure = where(step_, step_ >= 0 ? lesson_.steps[static_cast<size_t>(step_)].line : 0) + "lesson " + k + ": this step asks no question";
      r.code = 2;
      return r;
    }
    const Question& q = *lesson_.steps[static_cast<size_t>(step_)].question;
    Answer& a = answers_[static_cast<size_t>(step_)];
    if (k == "answer") {
      const std::string text = command.substr(command.find(w[1]));
      double v = 0;
      const bool number = q.parse_answer(text, v);
      if (q.choices.empty() && !number)
        r.failure = where(step_, q.line) + "lesson answer: '" + text + "' is not a number; write it as 0.25, 1/4 or 25%", r.code = 2;
      else if (!q.choices.empty() && (!number || v < 1 || v > static_cast<double>(q.choices.size())))
        r.failure = where(step_, q.line) + "lesson answer: give a choice number from 1 to " + std::to_string(q.choices.size()), r.code = 2;
      else a.given = true, a.number = v, a.choice = static_cast<int>(v) - 1;
    } else if (!a.given) {
      r.failure = where(step_, q.line) + "lesson check: answer first (lesson answer X)", r.code = 2;
    } else if (a.revealed) {  // checked again: against the answer revealed, never read again
      grade(step_);
      save();
    } else {
      settle_question(step_);
    }
  } else if (k == "_restart") {
    extra_.clear();
    until_.key.clear();
    return apply_scenario(session, -1, lesson_.flag_lines.empty() ? 1 : lesson_.flag_lines.front());
  } else if (k == "_enter") {
    step_ = std::clamp(arg(1), 0, n - 1);
    Answer& a = answers_[static_cast<size_t>(step_)];
    a.asked = false;
    a.shown.clear();
    actions(lesson_.steps[static_cast<size_t>(step_)].actions, step_, 'a', r.then);
    if (has_question(step_)) r.then.push_back(lesson_cmd("_ask " + std::to_string(step_)));
    save();
  } else if (k == "_settle") {
    settle_question(arg(1));
  } else if (k == "_ask") {
    if (has_question(arg(1))) ask(arg(1), session);
  } else if (k == "_reveal") {
    return reveal(arg(1), session);
  } else if (k == "_precheck") {
    // Nothing to do here: the script runner reads the screen at this point, before the reveal's actions.
  } else if (k == "_guard") {
    const Snapshot& s = session.update();
    const LessonStep& st = lesson_.steps[static_cast<size_t>(arg(1))];
    const auto& acts = w[2] == "r" ? st.question->reveal : st.actions;
    const LessonAction& a = acts[static_cast<size_t>(arg(3))];
    if (!s.error.empty()) r.failure = where(arg(1), a.line) + "'" + a.text + "': the run has already failed (" + s.error + ")";
  } else if (k == "_act") {
    const LessonStep& st = lesson_.steps[static_cast<size_t>(arg(1))];
    const auto& acts = w[2] == "r" ? st.question->reveal : st.actions;
    return act(acts[static_cast<size_t>(arg(3))], arg(1), command, session);
  } else if (k == "_done") {
    finished_ = true;
    save();
    if (play_) {
      int asked = 0;
      for (const LessonStep& st : lesson_.steps) asked += st.question ? 1 : 0;
      std::printf("lesson %s: played all %d steps; %d questions answered with the engine's live figures\n",
                  lesson_.name.c_str(), n, asked);
      std::fflush(stdout);
    }
  } else {
    r.failure = lesson_.path + ": unknown lesson command '" + command + "'", r.code = 2;
  }
  return r;
}

void LessonRunner::save() const {
  if (progress_file_.empty() || play_ || step_ < 0) return;
  LessonProgress p;
  p.step = step_ + 1;
  p.steps = steps();
  p.completed = finished_ || resume_.completed;
  for (const Answer& a : answers_) p.answered += a.checked ? 1 : 0, p.correct += a.correct ? 1 : 0;
  try {
    save_progress(progress_file_, lesson_.name, p);
  } catch (const Error& e) {
    std::fprintf(stderr, "dtlab: progress not saved: %s\n", e.what());
  }
}

std::string LessonRunner::figure_text(int figure, const Snapshot& s) const {
  if (figure < 0 || static_cast<size_t>(figure) >= lesson_.figures.size()) return "—";
  if (const int j = question_of_[static_cast<size_t>(figure)]; j >= 0) {
    const auto& shown = answers_[static_cast<size_t>(j)].shown;
    if (const auto it = shown.find(figure); it != shown.end()) return it->second;
  }
  return figure_value(lesson_.figures[static_cast<size_t>(figure)], FigureScope{&s, &marks_});
}

std::string LessonRunner::answer_text(int step) const {
  const Answer& a = answer(step);
  const Question& q = *lesson_.steps.at(static_cast<size_t>(step)).question;
  if (!q.choices.empty()) return a.live_choice >= 0 ? q.choices[static_cast<size_t>(a.live_choice)].text : "?";
  return format_figure(a.live) + (q.unit.empty() ? "" : " " + q.unit);
}

}  // namespace dtlab::app
