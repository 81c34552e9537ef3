// What each step of a collective algorithm moves, as a pure function of (op, algorithm, world, root,
// step): the same schedule engine/comm/threads_algorithms.cpp runs. Views use it to draw the step a
// paused world is about to take; what already happened comes from the RingStep events, and a test
// checks that the two agree.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/comm/communicator.h"
#include "engine/core/double_tree.h"  // kPipelineChunks, double_tree_links
#include "engine/trace/cost_model.h"  // HardwareProfile
#include "engine/trace/event.h"       // RingPhase

namespace dtlab {

struct StepTransfer {
  int src = -1, dst = -1;  // ranks; kNetworkSwitch for the in-network switch
  int chunk = -1;       // the chunk moved, of `chunks` even chunks of the buffer (chunk_begin); -1: all of it
  RingPhase phase = RingPhase::None;
  bool reduce = false;  // the receiver reduces (true) or copies (false)
  int chunks = 0;       // how many chunks `chunk` counts in (0 when chunk is -1)
};

// Elements [begin, end) of a `count`-element buffer that transfer `t` moves (the whole buffer when
// t.chunk is -1; chunk bounds as ring_order.h's chunk_begin cuts them, so sizes differ by at most one
// element).
std::pair<int64_t, int64_t> transfer_elements(const StepTransfer& t, int64_t count);

// The finest chunks the transfers of the double binary tree (2K), hierarchical (world: G x N) and
// in-network (K) all-reduces cut the buffer into, so a view can show every transfer as whole cells;
// 0 for the other algorithms (ring chunks are the world's, tree and naive move whole buffers).
int planned_chunks(Algorithm algo, int world, int node_size);
// The finest chunks [begin, end) of `chunks` that transfer `t` moves (t.chunks divides `chunks`).
std::pair<int, int> fine_chunks(const StepTransfer& t, int chunks);

// Steps the algorithm takes with `world` ranks (0 with one rank). `algo` must be resolved (not Default).
// `node_size`: ranks per node (the profile's gpus_per_node; 0 or >= world: one node), which only the
// hierarchical all-reduce reads (0 steps when world is not a whole number of nodes).
//   dbtree        2 (K + H - 1), K = kPipelineChunks, H = ceil(log2 world) (the trees' height)
//   hierarchical  2 (G - 1) + 2 (N - 1), G ranks per node, N = world / G nodes
//   nvls          K + 1
int algorithm_step_count(CollectiveOp op, Algorithm algo, int world, int node_size = 0);
// Transfers of step `step` (0-based); empty when out of range. `root`: broadcast/reduce root.
std::vector<StepTransfer> algorithm_step_plan(CollectiveOp op, Algorithm algo, int world, int root, int step,
                                              int node_size = 0);

// Rank r's part of step s of the ring all-reduce on n ranks, done as one fused reduce-copy (NCCL's
// recvReduceCopy / recvCopySend primitives; docs/course_sources.md §6): the plan's transfer into r (its
// predecessor's chunk ring_allreduce_recv_chunk, reduced in the reduce-scatter, copied in the
// all-gather) and whether that chunk becomes final there (the last reduce-scatter step, where Avg
// divides in the same pass). algorithm_step_plan's ring all-reduce, the threads ring and the cuda
// backend's fused kernel all take their steps from it.
struct RingStepWork {
  StepTransfer transfer;
  bool finishes = false;
};
RingStepWork ring_allreduce_step(int r, int s, int n);

// The ranks per node the hierarchical all-reduce groups: node_size, or world when node_size is 0 or
// at least world (one node).
int hierarchical_node_size(int world, int node_size);

// dtlab::Error, one sentence, unless all-reduce can run `algo` on `world` ranks of `profile`:
// hierarchical needs whole nodes, in-network needs a switch that reduces.
void check_algorithm_topology(Algorithm algo, int world, const HardwareProfile& profile);

}  // namespace dtlab
