// Plays a lesson (app/lesson.h) on the app's Session. Everything a lesson does is a command in the
// app's queue of scripted-run commands: the runner turns `lesson next` into the step's actions
// followed by its own bookkeeping (`lesson _reveal 3`), so a lesson advanced from the panel, by the
// presenter's N key, or played headless with `dtlab --lesson NAME --play` runs the same sequence.
// Going back replays the lesson from its scenario up to that step: the engine cannot run backwards,
// but the same steps on the same scenario reach the same state.
#pragma once
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "app/lesson.h"
#include "app/session.h"

namespace dtlab::app {

// What a user reached in a lesson, kept in progress.json.
struct LessonProgress {
  int step = 0, steps = 0;     // the step reached (1-based) of how many
  int answered = 0, correct = 0;
  bool completed = false;
};
// $XDG_STATE_HOME/dtlab/progress.json, else ~/.local/state/dtlab/progress.json ("" without HOME).
std::string progress_path();
// Lesson name -> progress; empty when the file is missing or unreadable.
std::map<std::string, LessonProgress> load_progress(const std::string& path);
// Updates one lesson's entry, writing the file atomically (a crash never leaves half of it).
void save_progress(const std::string& path, const std::string& lesson, const LessonProgress& p);

class LessonRunner {
 public:
  // play: answer every question with the live figure and fail on any disagreement (headless runs).
  // progress_file: where progress is kept ("" = nowhere).
  LessonRunner(Lesson lesson, bool play, std::string progress_file);

  struct Answer {
    int choice = -1;         // choice questions: 0-based
    double number = 0;       // numeric questions
    bool given = false;
    bool asked = false;      // the step's actions ran and the ask's figures were read (app/lesson.h)
    bool revealed = false;   // the reveal ran; `live` holds the engine's figure
    bool checked = false;    // the given answer was compared with it
    bool correct = false;
    double live = 0;
    int live_choice = -1;
    std::string note;        // the engine disagreed with the lesson's expect: (shown, not fatal, in the GUI)
    // The question's {{figures}} as read once, by index into Lesson::figures: the ask's when it
    // was asked, the explanation's at the reveal ("—" for one that had no value then).
    std::map<int, std::string> shown;
  };
  struct Result {
    std::vector<ScriptCommand> then;  // run these next, before anything else queued
    bool again = false;               // run the same command again next frame (run until)
    std::string failure;              // "lessons/x.md:12: step 3 'Ring steps': what went wrong"
    int code = 1;                     // a scripted run's exit code for it: 2 when the lesson file is at fault
  };
  // `command` is what follows `lesson` in a script (start, next, back, goto N, answer X, check, play,
  // demo) or one of the runner's own (_enter J, _reveal J, _act J a|r I, ...).
  Result exec(const std::string& command, Session& session);

  const Lesson& lesson() const { return lesson_; }
  int step() const { return step_; }  // -1 before the first step
  int steps() const { return static_cast<int>(lesson_.steps.size()); }
  Answer& answer(int step) { return answers_.at(static_cast<size_t>(step)); }
  const Answer& answer(int step) const { return answers_.at(static_cast<size_t>(step)); }
  bool finished() const { return finished_; }
  bool playing() const { return play_; }
  const LessonProgress& resume() const { return resume_; }  // as saved before this run opened it
  // A {{figure}} of the lesson's text: on `s` for the steps' prose; a question's as it was read
  // once (when asked, or at the reveal for its explanation), live only until then. "—" for no value.
  std::string figure_text(int figure, const Snapshot& s) const;
  // The live figures the current step's question asks about, while it waits for Check (or Reveal):
  // the views drawing them stay covered (app/spoilers.h). Empty otherwise.
  std::vector<std::string> pending_figures() const;
  // Per `topic:` of the lesson's questions, in the order they first appear: how many questions it
  // has, how many were checked with an answer and how many of those were right. Empty when no
  // question names a topic.
  struct TopicScore {
    std::string topic;
    int questions = 0, checked = 0, correct = 0;
  };
  std::vector<TopicScore> topic_scores() const;
  // The revealed answer in words: "6 bytes", or the right choice's text.
  std::string answer_text(int step) const;
  // The traces the applied scenario opens (its `open:` line, as dtlab --open), with their
  // companions; `open` empty when it opens none. The app loads them and hands the Session the
  // loaded trace, so the lesson's trace.* figures read it.
  struct TraceScenario {
    std::vector<std::string> open;
    std::vector<int> ranks;
    std::string model, profile = "this";
    int64_t batch = 32;
    double bucket_cap_mb = 25, first_bucket_mb = 1;
  };
  const TraceScenario& trace_scenario() const { return trace_scenario_; }

 private:
  std::string where(int step, int line) const;
  void actions(const std::vector<LessonAction>& acts, int step, char tag, std::vector<ScriptCommand>& out) const;
  Result act(const LessonAction& a, int step, const std::string& key, Session& session);
  void ask(int step, Session& session);
  Result reveal(int step, Session& session);
  void grade(int step);
  // Reads the figures of `prose` into the step's answer once; later frames show these values.
  void freeze(int step, const Prose& prose, const FigureScope& scope);
  Result apply_scenario(Session& session, int step, int line);
  void save() const;

  Lesson lesson_;
  bool play_ = false;
  std::string progress_file_;
  LessonProgress resume_;
  int step_ = -1;
  bool finished_ = false;
  std::vector<Answer> answers_;
  std::vector<int> question_of_;     // per figure: the step whose question shows it, -1 for the steps' prose
  std::vector<std::string> extra_;   // scenario flags added by `scenario` and `inject` actions
  std::map<std::string, Snapshot> marks_;
  TraceScenario trace_scenario_;
  struct Until {  // the `run until` in progress
    std::string key;
    int steps = 0;
    bool free = false;  // the world stopped settling at gates (a hang); it runs until the condition
    std::chrono::steady_clock::time_point since, last_still;
    SettleWait settle;  // the step just taken, or the pause once it held, settling
    bool held = false;  // the condition held; done once the pause settled
  } until_;
};

}  // namespace dtlab::app
