#include "app/trace_viewer.h"

#include <cstdio>

#include "engine/core/format.h"

namespace dtlab::app {

void TraceViewer::create(const AppOptions& o) {
  loader_ = std::make_unique<TraceLoader>();
  ui_.profile = o.compare_profile, ui_.model = o.trace_model;
  ui_.batch = o.trace_batch, ui_.bucket_cap_mb = o.trace_bucket_cap_mb;
  ui_.first_bucket_mb = o.trace_first_bucket_mb;
}

void TraceViewer::load(const std::vector<std::string>& paths, const std::vector<int>& ranks) {
  loader_->open(paths, ranks);
  snap_ = &loader_->poll();
}

void TraceViewer::poll() {
  if (loader_) snap_ = &loader_->poll();
}

std::shared_ptr<const ImportedTrace> TraceViewer::loaded() const {
  return snap_ && snap_->trace ? std::shared_ptr<const ImportedTrace>(snap_->trace, &snap_->trace->trace) : nullptr;
}

bool TraceViewer::sync_lesson(const LessonRunner* lesson, Session& session) {
  const std::vector<std::string> want = lesson ? lesson->trace_scenario().open : std::vector<std::string>{};
  if (want == lesson_traces_) return false;
  lesson_traces_ = want;
  session.set_trace(nullptr);
  snap_ = nullptr;
  loader_.reset();
  if (want.empty()) return false;
  const LessonRunner::TraceScenario& ts = lesson->trace_scenario();
  loader_ = std::make_unique<TraceLoader>();
  ui_ = TraceUi{};
  ui_.profile = ts.profile, ui_.model = ts.model, ui_.batch = ts.batch, ui_.bucket_cap_mb = ts.bucket_cap_mb;
  ui_.first_bucket_mb = ts.first_bucket_mb;
  load(ts.open, ts.ranks);
  return true;
}

void TraceViewer::after_draw() {
  if (ui_.reveal > 0) ui_.reveal--;
  if (ui_.cancel) loader_->cancel();
  if (ui_.reopen) loader_->reopen();
  if (ui_.compare) {
    TraceCompareOptions o;
    o.model = ui_.model, o.profile = ui_.profile, o.batch = ui_.batch, o.bucket_cap_mb = ui_.bucket_cap_mb;
    o.first_bucket_mb = ui_.first_bucket_mb;
    loader_->compare(o);
  }
  ui_.cancel = ui_.reopen = ui_.compare = false;
}

std::string TraceViewer::state_text() const {
  std::string state = trace_summary(*snap_);
  if (ui_.selected >= 0) state += "; collective " + std::to_string(ui_.selected) + " selected";
  if (snap_->comparison) state += "; compared on " + snap_->comparison->profile;
  return state;
}

TraceViewer::WaitTick TraceViewer::tick_wait() {
  WaitTick tick;
  if (!waiting_ || !loader_) return tick;
  const TraceSnapshot& t = loader_->poll();
  const bool load = wait_.arg == "trace";
  const TaskState st = load ? t.load : t.compare;
  if (st == TaskState::Running) {
    if (Clock::now() < wait_until_) {
      tick.waiting = true;
      return tick;
    }
    waiting_ = false;
    char why[200];
    if (load)
      std::snprintf(why, sizeof why, "the traces were still loading after %.0f s (%.0f%% of %s read); give wait trace a longer limit, e.g. wait trace 900s",
                    wait_.seconds, 100 * t.fraction, human_bytes(t.bytes).c_str());
    else
      std::snprintf(why, sizeof why, "the comparison was still running after %.0f s; give wait compare a longer limit", wait_.seconds);
    tick.timeout = why;
    tick.line = wait_.line;
    return tick;
  }
  waiting_ = false;
  if (load && st == TaskState::Done)
    std::printf("trace loaded in %.1f s: %s\n", t.trace->load_s, trace_summary(t).c_str());
  else if (!load && st == TaskState::Done)
    std::printf("compare %s: %s\n", t.comparison->profile.c_str(), t.comparison->summary.c_str());
  else if (st == TaskState::Failed || st == TaskState::Cancelled) {
    const std::string& why = st == TaskState::Cancelled ? std::string("loading the traces was cancelled") : load ? t.error : t.compare_error;
    std::fprintf(stderr, "dtlab: %s\n", tidy_sentence(why).c_str());
    tick.failed_load = true;
  }
  std::fflush(stdout);
  return tick;
}

std::string TraceViewer::script(const ScriptCommand& c) {
  const TraceSnapshot& t = loader_->poll();
  if (c.kind == ScriptCommand::WaitFor) {
    if (c.arg == "compare" && t.compare == TaskState::Idle) return "wait compare: no comparison was started; give compare [PROFILE] first";
    wait_ = c;
    waiting_ = true;
    wait_until_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(c.seconds));
    return "";
  }
  if (!t.trace) return "no trace is loaded (" + std::string(task_state_name(t.load)) + "); put wait trace before it";
  const ImportedTrace& tr = t.trace->trace;
  if (c.kind == ScriptCommand::Select) {
    if (c.count >= static_cast<int>(tr.collectives.size()))
      return "select collective " + std::to_string(c.count) + ": the trace holds " + std::to_string(tr.collectives.size()) +
             " collectives, numbered from 0";
    ui_.selected = c.count, ui_.reveal = 2;
    const TraceCollective& k = tr.collectives[static_cast<size_t>(c.count)];
    std::printf("selected collective %d: %s, iteration %d, bucket %d, last rank %d, %s late\n", c.count, k.name.c_str(), k.iteration,
                k.bucket, k.last_rank, time_text((k.last_arrival_us - k.first_arrival_us) * 1e-6).c_str());
  } else if (c.kind == ScriptCommand::Zoom) {
    if (std::string why = zoom_trace(t, ui_, c.arg, c.count); !why.empty()) return why;
  } else if (c.kind == ScriptCommand::Compare) {
    if (!c.arg.empty()) ui_.profile = c.arg;
    if (ui_.model.empty()) return "compare: the traced model is not known; give --trace-model SPEC or put dtlab.json beside the traces";
    if (t.compare == TaskState::Running) return "compare: a comparison is running already; wait compare first";
    ui_.compare = true;
  }
  std::fflush(stdout);
  return "";
}

}  // namespace dtlab::app
