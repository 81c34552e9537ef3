// dtlab's command line: the training run to show (the same options dtlab-cli train takes, for the
// ones the lab uses) and how to show it (script, screenshot, frame benchmark, presentation mode).
#pragma once
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
  int width = 1600, height = 900;
  bool modeled_clock = true;
  std::string config_dir;              // where imgui.ini lives (default: $XDG_CONFIG_HOME/dtlab)
};

// Parses argv; returns 0 to go on, -1 after --help/--version (exit 0), or 2 for bad input with the
// sentence already printed to stderr.
int parse_app_options(int argc, char** argv, AppOptions& out);

}  // namespace dtlab::app
