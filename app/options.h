// dtlab's command line: the training run to show (dtlab-cli train's flags, defined once in
// cli/train_flags.h, for the ones the lab uses) and how to show it (script, screenshot, frame
// benchmark, presentation mode).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "app/script.h"
#include "engine/train/train.h"

namespace dtlab::app {

struct AppOptions {
  TrainConfig train;
  std::vector<ScriptCommand> script;   // from --script / --run
  std::string screenshot;              // --screenshot PATH: one shot after --frames frames, then quit
  int frames = 3;
  int bench_frames = 0;                // --bench-frames N: run N frames, print frame-time stats, quit
  bool presentation = false;
  bool running = false;                // --running: start running instead of paused
  double speed = 0;                    // modeled seconds per wall second while running (0 = full speed)
  int width = 0, height = 0;           // the window's size; 0: 90% of the monitor's work area (app/display.h)
  bool fullscreen = false;             // --fullscreen: open full screen on the monitor (F11 toggles)
  float scale = 0;                     // --scale S: fonts and spacing; 0: the display's content scale
  bool modeled_clock = true;
  int compare = -1;                    // --compare SCHEDULE: the pipeline view's second schedule (a ScheduleKind)
  std::string config_dir;              // where imgui.ini lives (default: $XDG_CONFIG_HOME/dtlab)
  std::string lesson;                  // --lesson NAME|PATH.md: open this lesson (app/lesson.h)
  std::optional<uint64_t> lesson_seed;  // --seed with --lesson: the seed a lesson's `draw:` lines draw from
  bool plain = false;                  // no flag but the window's (size, scale, full screen, presentation): the start screen may show
  bool play = false;                   // --play: play the lesson headless, checking every step
  bool check_spoilers = false;         // --check-spoilers: with --play, fail when the screen shows an answer before its check
  std::string attach;                  // --attach HOST:PORT: show and step a launched run (its --monitor)
  // --open: the lab shows a recorded job's PyTorch profiler traces instead of a live run (app/trace_loader.h).
  std::vector<std::string> open;       // --open PATH (repeatable): a directory of per-rank traces, or the files
  std::vector<int> trace_ranks;        // --trace-ranks 0,1,...: each file's rank, for traces that record none
  std::string compare_profile = "this";  // --compare-profile NAME: the Compare panel's hardware profile
  std::string trace_model;             // --trace-model SPEC, else dtlab.json's "model"; "" when neither says
  int64_t trace_batch = 32;            // dtlab.json's "batch" (per rank)
  double trace_bucket_cap_mb = 25;     // dtlab.json's "bucket_cap_mb"
  double trace_first_bucket_mb = 1;    // dtlab.json's "first_bucket_mb"
};

// --unit-costs: every F, B, I and W of a pipeline costs this many modeled seconds (cli::kUnitActionCost,
// kept here so the app's headers need no CLI11).
constexpr double kUnitActionCost = 1e-3;
// Gives a pipeline run's model more hidden layers (of its last hidden width) when it has fewer
// Linear layers than the p x v stages.
void deepen_for_pipeline(TrainConfig& c);
// The Run panel's and the pipeline view's pipeline settings made runnable: world p x dp, no --accum,
// the batch rounded to a multiple of the micro-batches, the model deepened, a stale --split dropped.
void fit_pipeline(TrainConfig& c);

// The start screen's one-click scenarios (app/views/start_view.cpp), each a run that shows one idea
// within its first presses: DDP's buckets overlapping backward (the lab's defaults), FSDP's sharded
// memory, and a pipeline's bubble equal to its formula (every action 1 ms on the ideal profile).
enum class StartScenario { DdpOverlap, FsdpMemory, PipelineBubble };
// The run a scenario starts (paused), from the lab's defaults.
TrainConfig start_scenario_config(StartScenario s);
// How many Iteration steps the scenario takes before handing over: 3 reaches iteration 2 with
// DDP's buckets rebuilt and iteration 1's overlap on the timeline; 2 ends iteration 0 (FSDP's
// memory peaks, the pipeline's whole schedule).
int start_scenario_iterations(StartScenario s);
// "ddp", "fsdp", "pipeline" (the script's `start NAME`); false for another word.
bool parse_start_scenario(const std::string& word, StartScenario& out);

// Parses argv; returns 0 to go on, -1 after --help/--version (exit 0), or 2 for bad input with the
// sentence printed to stderr, or stored in *error when given (a lesson's scenario uses the flags).
int parse_app_options(int argc, char** argv, AppOptions& out, std::string* error = nullptr);

}  // namespace dtlab::app
