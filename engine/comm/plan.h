// What each step of a collective algorithm moves, as a pure function of (op, algorithm, world, root,
// step): the same schedule engine/comm/threads_algorithms.cpp runs. Views use it to draw the step a
// paused world is about to take; what already happened comes from the RingStep events, and a test
// checks that the two agree.
#pragma once
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/trace/event.h"  // RingPhase

namespace dtlab {

struct StepTransfer {
  int src = -1, dst = -1;
  int chunk = -1;       // ring algorithms: the chunk index moved (of world-size chunks); else -1
  RingPhase phase = RingPhase::None;
  bool reduce = false;  // the receiver reduces (true) or copies (false)
};

// Steps the algorithm takes with `world` ranks (0 with one rank). `algo` must be resolved (not Default).
// `node_size`: ranks per node (the profile's gpus_per_node; 0 or >= world: one node), which only the
// hierarchical all-reduce reads.
int algorithm_step_count(CollectiveOp op, Algorithm algo, int world, int node_size = 0);
// Transfers of step `step` (0-based); empty when out of range. `root`: broadcast/reduce root.
std::vector<StepTransfer> algorithm_step_plan(CollectiveOp op, Algorithm algo, int world, int root, int step,
                                              int node_size = 0);

}  // namespace dtlab
