// Scripted runs (demos and headless tests): `dtlab --run "step collective 3; screenshot a.png; quit"`
// or `--script FILE` (one command per line, # comments). Parsed up front, so a typo fails with one
// sentence before any window opens.
#pragma once
#include <string>
#include <vector>

namespace dtlab::app {

struct ScriptCommand {
  enum Kind { StepRing, StepCollective, StepIteration, Run, Pause, View, Screenshot, Wait, Speed,
              Presentation, Clock, SetEpoch, Reset, Quit,
              Lesson,  // `lesson open NAME|next|back|goto N|answer X|check|play|demo|close` (app/lesson.h)
              StepAction,  // `step action [N]`: N time steps of a pipeline schedule
              // Imported traces (dtlab --open):
              WaitFor,     // `wait trace|compare [SECONDS]s`: until the load (or comparison) ends; seconds: the limit
              Select,      // `select collective K`: count = K
              Compare,     // `compare [PROFILE]`: start the Compare panel's run; arg: the profile ("" keeps the panel's)
              Zoom,        // `zoom all|iteration N|collective K`: arg the what, count N or K
              StepLayer,   // `step layer [N]`: N layers' forward or backward
              StepBucket,  // `step bucket [N]`: until N more gradients landed in DDP buckets
              Focus,       // `focus rank R|group NAME|none`: count R (-1 none), arg the group
              FullScreen,  // `fullscreen on|off`: F11's full screen on the window's monitor
              StartScreen,  // `start on|off|ddp|fsdp|pipeline|course`: the start screen, or one of its choices
              CheckLayout,  // `check layout`: list the windows that cut off or scroll their content
              // A/B comparison (app/compare.h):
              Pin,         // `pin`: the run on screen becomes A
              Unpin,       // `unpin`: the views show the live run alone again
              CompareRun,  // `compare --FLAG VALUE ...`: B, the run with those settings changed (pins A first when none is)
              Sizing,      // `sizing KEY=VALUE ...`: the Sizing view's settings (engine/parallel/sizing.h's spec), arg the spec;
                           // `sizing run`: its "Run it scaled down", arg "run"
              Generate,    // `generate TEXT`: a GPT run continues TEXT in the data view (arg the text)
              Colour,      // `colour kind|peak`: the timeline's spans by kind, or by their fraction of the roof
              Context };   // `context block L [forward|backward]`: the Context view's block (count L, arg the way);
                           // `context follow`: back to the pass running now (count -1, arg "follow")
  Kind kind = Quit;
  int count = 1;        // step commands: how many
  double seconds = 0;   // run / wait: how long (run 0 = run on)
  double value = 0;     // speed
  std::string arg;      // view name, screenshot path, on/off, clock name, lesson command
  int line = 0;         // where it came from, for messages
};

// The view names `view` accepts (and the app's windows): ring, buckets, timeline, memory,
// inspector, data, shards, pipeline, sweep, all; with --open also collectives, breakdown, compare.
const std::vector<std::string>& view_names();

// Commands that drive a live run (step, run, pause, speed, clock, set_epoch, reset, lesson), and
// those that need imported traces (wait trace, select, compare, zoom, the trace panels' views).
bool live_command(const ScriptCommand& c);
bool trace_command(const ScriptCommand& c);

// Parses commands separated by newlines or ';'. Throws dtlab::Error naming the line and the fix.
std::vector<ScriptCommand> parse_script(const std::string& text, const std::string& origin);

// Where `screenshot PATH` (or --screenshot PATH) cannot write: a name that is not .png, a directory
// that does not exist, a directory in its place (one sentence naming the fix); "" when it can.
std::string screenshot_path_problem(const std::string& path, const std::string& what);

// A script or lesson file, read whole when it holds at most `max_bytes` (a device like /dev/zero
// never ends): false when it is larger. Throws nothing; `out` holds what was read.
inline constexpr size_t kMaxTextFileBytes = size_t{1} << 20;
bool read_text_file(const std::string& path, std::string& out, size_t max_bytes = kMaxTextFileBytes);

}  // namespace dtlab::app
