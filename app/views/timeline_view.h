// The timeline view (timeline_view.cpp) and what it keeps between frames, which the app owns: the
// range in view, as Tracy keeps its zoom, and the index of every rank's rows (app/timeline_index.h).
#pragma once
#include "app/timeline_index.h"
#include "app/views/views.h"

namespace dtlab::app {

struct TimelineViewState {
  bool follow = true;   // track the latest iterations until the user zooms or pans
  bool modeled = true;  // the clock t0/t1 are in
  bool by_peak = false; // colour compute and collective spans by their fraction of the device's roof
  double t0 = 0, t1 = 1e-3;
  TimelineIndex index;  // every rank's rows, extended each frame with the new events
  FrameSpans frame;     // one rank's spans derived for the range in view (kept for its capacity)
};

void draw_timeline_view(const Snapshot& s, TimelineViewState& view, ViewContext& ctx);

}  // namespace dtlab::app
