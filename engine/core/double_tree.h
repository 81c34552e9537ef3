// NCCL's double binary tree (src/graph/trees.cc, ncclGetBtree / ncclGetDtree; docs/course_sources.md
// §6b), written once for the step plans (engine/comm/plan.cpp), the cost model's closed form
// (engine/trace/cost_model.cpp) and the views.
#pragma once

namespace dtlab {

// Chunks the double binary tree cuts each tree's half of the buffer into, and the in-network
// all-reduce the whole buffer: the pipeline's depth (NCCL pipelines its trees the same way, in
// chunks of a few hundred KiB; docs/course_sources.md §6b).
inline constexpr int kPipelineChunks = 4;

// NCCL's double binary tree (src/graph/trees.cc, ncclGetDtree): tree 0 is the in-order binary tree
// rooted at rank 0; tree 1 mirrors it (r -> world-1-r) for an even world and shifts it by one rank
// for an odd one, so a rank that is an inner node in one tree is a leaf in the other.
struct TreeLinks {
  int parent = -1;           // -1 at the root
  int child[2] = {-1, -1};   // -1: none
  int height = 0;            // leaves 0
  int depth = 0;             // root 0
};
TreeLinks double_tree_links(int world, int tree, int rank);
int double_tree_root(int world, int tree);  // 0; world-1 (even) or 1 (odd)
// The parent of `rank` in tree 0 or 1 (-1 at the root).
int double_tree_parent(int world, int tree, int rank);

}  // namespace dtlab
