// The live figures of tensor parallelism and the 3-D mesh (figure_table.cpp lists them; the lessons
// 20_tensor_parallel and 21_3d_parallelism read them): what a rank holds, which layer issued a
// collective, a mesh group's collectives per iteration, and the 3-D planner (mesh_plan.h).
#pragma once
#include <string>

#include "app/snapshot.h"

namespace dtlab::app {

// Elements of parameter `name` ("2.weight") rank `rank` holds: its tensor-parallel slice, or 0 when its
// pipeline stage does not hold the layer.
double mesh_holds(const Snapshot& s, double rank, const std::string& name);
// The Sequential index of the layer whose forward or backward rank 0 ran last before it issued the
// shown collective (a TP collective's f or g follows its layer); -1 when none did in that iteration.
double collective_layer(const Snapshot& s);
// Collectives `op` rank 0 ran in iteration `iter` in its group named `group`: "tp", "dp", "pp" (the
// group's name without its number) or "world".
double count_group_collectives(const Snapshot& s, double iter, const std::string& op, const std::string& group);
// One number of the 3-D planner for `spec`, words "key=value" separated by spaces: params (7B),
// world, tp, stages, layers, hidden, seq, micro_batch, micro_batches, dtype (fp32 | mixed), sharding
// (no-shard | zero1 | grad-op | full), sp (0 | 1), profile. `what`: "tp", "pp" or "dp" (bytes a rank
// sends per step along it), "spanning:tp" (groups of that dimension spanning nodes), "slowest" (bytes
// per rank per step on the slowest link), "rank_params", "memory" (bytes per rank), "nodes".
double plan_mesh_figure(const std::string& what, const std::string& spec);

}  // namespace dtlab::app
