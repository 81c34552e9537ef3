// The lab's A/B comparison on screen (app/compare.h has the figures): the pinned run A and the live
// run B drawn one above the other in the Timeline, Memory, Buckets and Pipeline windows, on one
// scale, and the table of what differs. The app owns one CompareState; a view window in a comparison
// calls draw_sides with its own drawing function.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "app/compare.h"
#include "app/views/memory_view.h"
#include "app/views/timeline_view.h"
#include "app/views/views.h"

namespace dtlab::app {

struct CompareState {
  Pinned pinned;  // A; no snapshot: no comparison
  // What A's views keep between frames (B's are the app's own).
  TimelineViewState timeline;
  MemoryViewState memory;
  std::unique_ptr<PipelineViewState> pipeline = std::make_unique<PipelineViewState>();
  // Per window, the scale both sides drew with last frame (the larger of the two).
  struct Scale {
    double span = 0, bytes = 0;
  };
  std::map<std::string, Scale> scales;
  // B's summary, made again only when B recorded something new (summarize_run walks every kept event:
  // not once a frame while B sits paused).
  uint64_t b_key = UINT64_MAX;
  RunSummary b;

  bool active() const { return pinned.snapshot != nullptr; }
  // Pins `s` (a copy) as A; the views of A start over (following its last iterations).
  void pin(const Snapshot& s);
  void unpin();
  const RunSummary& summary_b(const Snapshot& live);
};

// Draws `draw` for A (the pinned snapshot) in the upper half of the current window and for B (`live`)
// in the lower half, each under a caption naming its settings, on one scale. `draw` gets the side's
// snapshot and true for A. A's controls never act on the live run: what A's side asks of the app
// (a restart, a focus) is dropped.
void draw_sides(CompareState& c, const Snapshot& live, ViewContext& ctx, const char* id,
                const std::function<void(const Snapshot& s, bool a)>& draw);

// The four windows a comparison splits, each with B's view state (the app's own).
void draw_timeline_compared(CompareState& c, const Snapshot& live, TimelineViewState& b, ViewContext& ctx);
void draw_memory_compared(CompareState& c, const Snapshot& live, MemoryViewState& b, ViewContext& ctx);
void draw_buckets_compared(CompareState& c, const Snapshot& live, ViewContext& ctx, bool shards);
void draw_pipeline_compared(CompareState& c, const Snapshot& live, PipelineViewState& b, ViewContext& ctx);

// The differences table (step time, overlap, peak memory, the slowest link) with the settings that
// differ above it; `unpin` is set when its button was pressed.
void draw_compare_table(CompareState& c, const Snapshot& live, bool& unpin);

}  // namespace dtlab::app
