// The desktop app: a GLFW window with an OpenGL 3.3 core context, Dear ImGui, the toolbar and the
// configuration panel, the views, scripted runs, screenshots and the frame benchmark.
#pragma once
#include "app/options.h"

namespace dtlab::app {

// Runs the app until the window closes or a script quits; returns the process exit code (2 with
// one sentence on stderr when there is no display or no OpenGL 3.3).
int run_app(AppOptions& options);

}  // namespace dtlab::app
