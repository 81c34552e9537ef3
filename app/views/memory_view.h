// The memory view (memory_view.cpp) and what it keeps between frames, which the app owns: the rank
// the legend details, the room the comparison took, and the planner's bytes for the running model.
#pragma once
#include <array>
#include <string>

#include "app/views/views.h"
#include "engine/parallel/memory_plan.h"

namespace dtlab::app {

// The memory planner's per-rank bytes under NO_SHARD, ZeRO-1, SHARD_GRAD_OP and FULL_SHARD.
struct MemoryPlanSet {
  bool ok = false;
  std::string error;
  std::array<MemoryPlan, 4> plans;  // in that order
};

struct MemoryViewState {
  int hovered_rank = -1;  // the bar under the mouse last frame, which the legend details; -1: none
  float compare_h = 0;    // the comparison's height last frame, kept free below the live bars
  // Planned once per configuration, not per frame.
  bool have_plans = false;
  MemoryPlanInput plans_for;
  MemoryPlanSet plans;
};

void draw_memory_view(const Snapshot& s, MemoryViewState& view, ViewContext& ctx);

}  // namespace dtlab::app
