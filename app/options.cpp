#include "app/options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iterator>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/train_flags.h"
#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/io/atomic_file.h"
#include "engine/monitor/monitor.h"
#include "engine/parallel/pipeline.h"
#include "engine/trace/cost_model.h"
#include "app/trace_loader.h"

namespace dtlab::app {

static_assert(kUnitActionCost == cli::kUnitActionCost, "--unit-costs and the Run panel's unit costs are one");

namespace {

// The most ranks the lab draws (dtlab-cli train runs up to cli::kMaxRanks).
constexpr int kLabMaxRanks = 16;

// What the lab parses beside the shared training flags (cli/train_flags.h), before it is checked.
struct LabFlags {
  cli::TrainFlags train;
  std::string clock = "modeled", compare, script_file, run_cmds;
};

// --open and its companions: the paths exist and hold traces, one rank per file, a known profile,
// a model dtlab can build (given, or from the directory's dtlab.json); live-run flags and script
// commands are refused, since no training runs.
void check_open(const CLI::App& app, const cli::TrainFlags& f, AppOptions& o) {
  if (o.open.empty()) {
    for (const char* flag : {"--trace-ranks", "--compare-profile", "--trace-model"})
      if (app.count(flag) > 0) throw Error(std::string(flag) + " goes with --open DIR; add --open and the traces' directory");
    for (const ScriptCommand& c : o.script)
      if (trace_command(c) && o.lesson.empty())  // a lesson may open traces (its `open:` line)
        throw Error("script command " + std::to_string(c.line) + " works on imported traces; add --open DIR");
    return;
  }
  if (!o.attach.empty()) throw Error("--open shows recorded traces and --attach a launched run; drop one of them");
  if (!o.lesson.empty() || o.play) throw Error("--open shows recorded traces and --lesson runs its own; drop one of them");
  for (const CLI::Option* flag : f.all)
    if (flag->count() > 0)
      throw Error("--open shows a recorded job, so " + flag->get_name() + " cannot apply; drop it (--trace-model and "
                  "--compare-profile set the Compare panel's run)");
  for (const char* flag : {"--running", "--speed", "--clock", "--compare"})
    if (app.count(flag) > 0) throw Error(std::string("--open shows a recorded job, so ") + flag + " cannot apply; drop it");
  for (const ScriptCommand& c : o.script)
    if (c.kind == ScriptCommand::View && !trace_command(c) && c.arg != "timeline" && c.arg != "inspector" && c.arg != "all")
      throw Error("script command " + std::to_string(c.line) + " 'view " + c.arg + "' shows a live run; with --open the views are "
                  "timeline, collectives, breakdown, compare and all");
  for (const ScriptCommand& c : o.script)
    if (live_command(c))
      throw Error("script command " + std::to_string(c.line) + " steps a live run, and --open shows a recorded job; "
                  "use wait trace, select collective K, zoom, compare, view, screenshot and quit");
  const TraceFiles files = list_trace_files(o.open);
  if (!o.trace_ranks.empty()) {
    if (o.trace_ranks.size() != files.files.size())
      throw Error("--trace-ranks names " + std::to_string(o.trace_ranks.size()) + (o.trace_ranks.size() == 1 ? " rank" : " ranks") +
                  " for " + std::to_string(files.files.size()) + (files.files.size() == 1 ? " trace file" : " trace files") +
                  "; give one rank per file, in the order " + (o.open.size() == 1 && files.files.size() > 1 ? "the files sort" : "given"));
    std::vector<int> sorted = o.trace_ranks;
    std::sort(sorted.begin(), sorted.end());
    if (auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end())
      throw Error("--trace-ranks gives rank " + std::to_string(*d) + " twice; each file is one rank");
  }
  if (o.compare_profile != "this" && o.compare_profile != "ideal") {
    try {
      find_profile(o.compare_profile);
    } catch (const Error& e) {
      throw Error(std::string("--compare-profile: ") + e.what());
    }
  }
  const TraceMeta meta = read_trace_meta(o.open);
  o.trace_batch = meta.batch;
  o.trace_bucket_cap_mb = meta.bucket_cap_mb;
  o.trace_first_bucket_mb = meta.first_bucket_mb;
  if (app.count("--trace-model") == 0) o.trace_model = meta.model;
  if (!o.trace_model.empty()) {
    const std::string where = app.count("--trace-model") > 0 ? "--trace-model" : meta.path + "'s model";
    try {
      o.trace_model = ModelSpec::parse(cli::model_preset_spec(o.trace_model)).str();
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
  }
}

// The lab's defaults for the shared training flags: a run to step through by hand.
void set_lab_defaults(TrainConfig& c) {
  c.strategy = Strategy::Ddp;
  c.world_size = 4;
  c.steps = 1000;
  c.batch = 64;
  // The lab's clock models this machine by default: compute and communication then show at the
  // scale they really run here, so backward and the overlapping all-reduces are both visible
  // (on nvlink8 a lesson-sized model's compute is nanoseconds next to microseconds of latency).
  c.profile = "this";
  c.timeout_s = 60;
  c.pipeline.stages = 4;  // a pipeline starts at p = 4, m = 8
  c.pipeline.microbatches = 8;
  c.model = ModelSpec::parse(model_preset_spec("wide"));
  // Small caps so the lesson model shows several buckets.
  c.ddp.bucket_cap_bytes = 4096;
  c.ddp.first_bucket_bytes = 1024;
}

// The flags about the window: what it shows, how, and for how long.
void add_window_flags(CLI::App& app, AppOptions& o, LabFlags& f) {
  f.train.grouped.emplace_back(  // a pipeline flag: refused with another strategy, like the shared ones
      SettingGroup::Pipeline,
      app.add_option("--compare", f.compare, "Pipeline view: simulate this schedule under the run's, with its action costs"));
  app.add_option("--clock", f.clock, "Timeline clock: modeled or wall")->capture_default_str();
  app.add_option("--script", f.script_file, "Run the commands in FILE (one per line)")->check(CLI::ExistingFile);
  app.add_option("--run", f.run_cmds, "Run commands, separated by ';' (e.g. \"step collective 3; screenshot a.png; quit\")");
  app.add_option("--screenshot", o.screenshot, "Save PATH.png after --frames frames, then quit");
  app.add_option("--frames", o.frames, "Frames before --screenshot")->check(cli::whole_number(1, 100000))->capture_default_str();
  app.add_option("--bench-frames", o.bench_frames, "Render N frames and print median and p95 CPU ms per frame")
      ->check(cli::whole_number(1, 1000000));
  app.add_flag("--presentation", o.presentation, "Large fonts and high contrast (projectors)");
  app.add_flag("--running", o.running, "Start running instead of paused");
  app.add_option("--speed", o.speed, "Modeled seconds per wall second while running (0: full speed)")->check(cli::real_number(0.0, 1e6));
  app.add_option("--width", o.width, "Window width in pixels (default: 90% of the monitor's work area)")->check(cli::whole_number(320, 8192));
  app.add_option("--height", o.height, "Window height in pixels (default: 90% of the monitor's work area)")->check(cli::whole_number(240, 8192));
  app.add_flag("--fullscreen", o.fullscreen, "Open full screen on the monitor (F11 toggles; for projectors)");
  app.add_option("--scale", o.scale, "Scale of fonts and spacing, e.g. 1.5 (default: the display's content scale, 2 on most HiDPI screens)")
      ->check(cli::real_number(0.5, 4.0));
  app.add_option("--config-dir", o.config_dir, "Where the window layout (imgui.ini) is kept");
  app.add_option("--lesson", o.lesson, "Open a lesson: NAME (lessons/*NAME.md) or PATH.md; with --seed N, a lesson that draws its numbers (the interview drill) draws them from N");
}

// The flags that show a run other than the window's own: a launched one, or recorded traces.
void add_source_flags(CLI::App& app, AppOptions& o) {
  app.add_option("--attach", o.attach, "Show and step a launched run: HOST:PORT of its 'train --monitor PORT' (rank 0's host)");
  app.add_option("--open", o.open, "Show a multi-rank job's PyTorch profiler traces: a directory of per-rank .json/.json.gz files, "
                                   "or the files (repeatable)");
  app.add_option("--trace-ranks", o.trace_ranks, "With --open: the rank of each file in order, for traces that record none (e.g. 0,1,2,3)")
      ->delimiter(',')->check(cli::whole_number(0, 4095));
  app.add_option("--compare-profile", o.compare_profile, "With --open: the hardware profile dtlab models the traced all-reduces on")
      ->capture_default_str();
  app.add_option("--trace-model", o.trace_model, "With --open: the traced model as dtlab builds it, e.g. mlp:2,512,512,3 (default: dtlab.json's)");
  app.add_flag("--check-spoilers", o.check_spoilers, "With --play: fail when a question's answer is on screen before its check");
  app.add_flag("--play", o.play, "With --lesson: play it without a person (it still needs a display: xvfb-run -a), answering with the live figures; exit 1 on a failed step");
}

// The window's own run from the shared flags, within what the lab draws. A lesson's scenario keeps
// the CPU engine its figures were written against unless it names --device.
void finish_lab_run(AppOptions& o, const LabFlags& f, bool scenario) {
  TrainConfig& c = o.train;
  // Before the rows' own checks (--strategy single refuses any --world but 1): the lab's limit first.
  if (const std::string world = f.train.text("--world"); !world.empty() && std::stoi(world) > kLabMaxRanks)
    throw Error("--world " + world + " is more ranks than the lab draws; use 1 to " +
                std::to_string(kLabMaxRanks) + " (dtlab-cli train runs up to " + std::to_string(cli::kMaxRanks) + ")");
  cli::finish_train_flags(f.train, c);
  if (c.strategy == Strategy::Pipeline) {
    if (!f.compare.empty()) o.compare = static_cast<int>(parse_schedule_kind(f.compare));
    if (c.world_size > kLabMaxRanks)
      throw Error("--stages x --dp is " + std::to_string(c.world_size) + " ranks; the lab runs at most " + std::to_string(kLabMaxRanks));
    if (!f.train.given("--model")) deepen_for_pipeline(c);  // the default model, cut into p x v stages
  }
  if (c.backend == "socket")
    throw Error("--backend socket is how dtlab-cli launch runs one process per rank; to watch such a run, launch it "
                "with --monitor PORT and start dtlab --attach HOST:PORT");
  cli::choose_device(f.train, c, c.world_size, scenario ? "cpu" : "");
}

// --attach: a launched run's configuration is its ranks' (dtlab-cli train ... --monitor PORT), so a
// flag that would configure this window's own run cannot change it: refused, not ignored.
void check_attach(const AppOptions& o, const cli::TrainFlags& f) {
  if (o.attach.empty()) return;
  std::string host;
  int port = 0;
  parse_monitor_address(o.attach, host, port);
  if (!o.lesson.empty()) throw Error("--attach shows a launched run and --lesson runs its own; drop one of them");
  for (const CLI::Option* flag : f.all)
    if (flag->count() > 0)
      throw Error("--attach shows a launched run as its ranks were started, so " + flag->get_name() +
                  " cannot apply; give it to 'dtlab-cli train' under dtlab-cli launch, or drop it");
}

// --script FILE or --run "commands": the commands, and what cannot go with them.
void read_script(const CLI::App& app, AppOptions& o, const LabFlags& f) {
  if (!f.script_file.empty() && !f.run_cmds.empty()) throw Error("give --script FILE or --run \"commands\", not both");
  if (!f.script_file.empty()) {
    std::string text;
    if (const std::string why = not_a_regular_file(f.script_file); !why.empty()) throw Error("--script " + f.script_file + " " + why);
    if (!read_text_file(f.script_file, text))
      throw Error("--script " + f.script_file + " is larger than 1 MiB; a script is a few lines of commands");
    o.script = parse_script(text, f.script_file);
    if (o.script.empty())  // otherwise the lab would open interactively and never quit
      throw Error("--script " + f.script_file + " holds no commands; write one per line, e.g. 'step collective 3' and 'quit'");
  } else if (app.count("--run") > 0) {
    o.script = parse_script(f.run_cmds, "--run");
    if (o.script.empty()) throw Error("--run holds no commands; give e.g. --run \"step collective 3; quit\"");
  }
  if (!o.screenshot.empty() && !o.script.empty()) throw Error("--screenshot is a one-shot; inside a script use the screenshot command");
  if (o.play && !o.script.empty()) throw Error("--play plays the whole lesson; to stop at a step, drop --play and script `lesson goto N`");
  if (app.count("--screenshot") > 0 && o.screenshot.size() < 5) throw Error("--screenshot needs a PATH.png");
  if (!o.screenshot.empty())
    if (const std::string why = screenshot_path_problem(o.screenshot, "--screenshot"); !why.empty()) throw Error(why);
}

// Everything after parsing, in the order the sentences should win when several flags are wrong.
void finish_options(const CLI::App& app, AppOptions& o, const LabFlags& f, bool scenario) {
  if (f.clock != "modeled" && f.clock != "wall") throw Error("--clock " + f.clock + " is not a clock; use modeled or wall");
  o.modeled_clock = f.clock == "modeled";
  finish_lab_run(o, f, scenario);
  if (o.play && o.lesson.empty()) throw Error("--play plays a lesson; add --lesson NAME");
  if (!o.lesson.empty() && f.train.given("--seed")) o.lesson_seed = static_cast<uint64_t>(o.train.seed);
  if (o.check_spoilers && !o.play) throw Error("--check-spoilers checks a played lesson; add --play --lesson NAME");
  check_attach(o, f.train);
  read_script(app, o, f);
  check_open(app, f.train, o);
  o.train.start_paused = !o.running;
}

}  // namespace

TrainConfig start_scenario_config(StartScenario sc) {
  TrainConfig c;
  set_lab_defaults(c);
  c.start_paused = true;
  switch (sc) {
    case StartScenario::DdpOverlap: break;  // the lab's defaults are this scenario
    case StartScenario::FsdpMemory:
      c.strategy = Strategy::Fsdp;
      c.fsdp.sharding = Sharding::FullShard;
      break;
    case StartScenario::PipelineBubble:
      c.strategy = Strategy::Pipeline;
      c.pipeline.schedule = ScheduleKind::OneFOneB;
      c.pipeline.stages = 4, c.pipeline.microbatches = 8, c.pipeline.chunks = 1;
      // The textbook's equal stages: every F and B costs 1 ms and communication is free, so the
      // measured bubble equals (p-1)/(m+p-1) (docs/course_sources.md §14).
      c.pipeline.fixed_costs = ActionCosts{kUnitActionCost, kUnitActionCost, kUnitActionCost, kUnitActionCost, 0};
      c.profile = "ideal";
      fit_pipeline(c);
      break;
  }
  return c;
}

int start_scenario_iterations(StartScenario sc) { return sc == StartScenario::DdpOverlap ? 3 : 2; }

bool parse_start_scenario(const std::string& word, StartScenario& out) {
  if (word == "ddp") out = StartScenario::DdpOverlap;
  else if (word == "fsdp") out = StartScenario::FsdpMemory;
  else if (word == "pipeline") out = StartScenario::PipelineBubble;
  else return false;
  return true;
}

void deepen_for_pipeline(TrainConfig& c) {
  std::vector<int64_t>& d = c.model.dims;
  const int64_t width = d.size() > 2 ? d[d.size() - 2] : 64;
  while (static_cast<int>(d.size()) - 1 < c.pipeline.stages * c.pipeline.chunks) d.insert(d.end() - 1, width);
}

void fit_pipeline(TrainConfig& c) {
  PipelineOptions& o = c.pipeline;
  c.world_size = o.stages * o.dp * std::max(c.cp, 1) * std::max(c.tp, 1);  // a rank per stage, CP rank, TP rank and replica
  c.accum = 1;
  if (c.batch % o.microbatches != 0)
    c.batch = std::max<int64_t>(1, (c.batch + o.microbatches / 2) / o.microbatches) * o.microbatches;
  deepen_for_pipeline(c);
  if (!o.split.empty() && static_cast<int>(o.split.size()) != o.stages * o.chunks) o.split.clear();
}

int parse_app_options(int argc, char** argv, AppOptions& o, std::string* error) {
  // A launch with no run or script of its own (the quick start's `dtlab`) gets the start screen.
  o.plain = true;
  for (int a = 1; a < argc; a++) {
    const std::string flag = std::string(argv[a]).substr(0, std::string(argv[a]).find('='));
    static const char* kWindowFlags[] = {"--width", "--height", "--fullscreen", "--scale", "--presentation", "--config-dir"};
    const bool window = std::find(std::begin(kWindowFlags), std::end(kWindowFlags), flag) != std::end(kWindowFlags);
    if (flag.rfind("--", 0) == 0 && !window) o.plain = false;
  }
  CLI::App app{"dtlab: step through distributed training, collective by collective", "dtlab"};
  LabFlags f;
  set_lab_defaults(o.train);
  cli::add_train_flags(app, f.train, o.train, SettingScope::Both);
  add_window_flags(app, o, f);
  add_source_flags(app, o);
  app.set_version_flag("--version", "dtlab 0.1.0");
  try {
    app.parse(argc, argv);
    finish_options(app, o, f, error != nullptr);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return -1;
  } catch (const CLI::CallForVersion&) {
    std::printf("dtlab 0.1.0\n");
    return -1;
  } catch (const CLI::ExtrasError& e) {
    const std::vector<std::string> args(argv + 1, argv + argc);
    const std::string text = cli::unknown_flag_text(e, args, app);
    if (error) *error = text;
    else std::fprintf(stderr, "dtlab: %s; run 'dtlab --help' for the list of flags\n", tidy_sentence(text).c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    if (error) *error = e.what();
    else std::fprintf(stderr, "dtlab: %s\n", tidy_sentence(cli::parse_error_sentence(e, "dtlab --help")).c_str());
    return 2;
  } catch (const Error& e) {
    if (error) *error = e.what();
    else std::fprintf(stderr, "dtlab: %s\n", tidy_sentence(e.what()).c_str());
    return 2;
  }
  return 0;
}

}  // namespace dtlab::app
