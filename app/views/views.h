// The views: each draws one panel's contents into the current ImGui window from the Snapshot only.
// View-local UI state (zoom, selection) lives in the view's own file.
#pragma once
#include <imgui.h>

#include "app/gl.h"
#include "app/snapshot.h"

namespace dtlab::app {

struct ViewContext {
  double time = 0;             // seconds since the app started (animation phase)
  bool presentation = false;   // large fonts, high contrast
  bool modeled_clock = true;   // timeline: modeled (true) or wall clock
  GlResources* gl = nullptr;   // shaders and render targets; a view falls back when a program is null
  bool data_set_epoch = true;  // data view's switch; the view may flip it, the app passes it on
};

void draw_ring_view(const Snapshot& s, ViewContext& ctx);
void draw_bucket_view(const Snapshot& s, ViewContext& ctx);
void draw_timeline_view(const Snapshot& s, ViewContext& ctx);
void draw_memory_view(const Snapshot& s, ViewContext& ctx);
void draw_inspector_view(const Snapshot& s, ViewContext& ctx);
void draw_data_view(const Snapshot& s, ViewContext& ctx);

// Shared colors, so a rank or a state reads the same in every view.
ImU32 rank_color(int rank, int world, float alpha = 1.0f);
ImU32 bucket_state_color(BucketState s);
ImU32 memory_category_color(MemCategory c);
// A cell holding `held` of `world` contributions: partial sums warm up towards the final color.
ImU32 contribution_color(int held, int world);

}  // namespace dtlab::app
