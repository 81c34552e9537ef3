// The ring view's geometry, solved apart from drawing: where each rank's node and its buffer block
// of chunk cells sit in a canvas, from the world size, the chunk count and the font size alone. No
// ImGui or GL call happens here (ImVec2 is only the coordinate type), so tests check the solver and
// app/views/ring_view.cpp only draws on what it returns.
#pragma once
#include <imgui.h>

#include <vector>

namespace dtlab::app {

struct RingLayout {
  ImVec2 center;
  float radius = 0;      // ring radius (node centers)
  float node_r = 0;
  bool cells = false;    // buffer blocks shown
  float cell = 0, cell_gap = 0;
  int cols = 1, rows = 1;
  ImVec2 block_size;
  std::vector<ImVec2> node;   // node centers
  std::vector<ImVec2> block;  // top-left of each rank's cell block
};

// Tries buffers as one, two or four rows of cells of every size from large to small and keeps the
// largest cells that leave the ring at least `keep` of the size it has without them (the ring is
// the picture; cells are its annotation), relaxing that when nothing fits; no cells as a last resort.
// Rank 0 sits at the top, the others clockwise; canvas `size` at screen position `p0`.
RingLayout make_ring_layout(ImVec2 p0, ImVec2 size, int n, int chunks, float fs, bool want_cells);

// The layout search runs only when the canvas, the world or the font changed.
struct RingLayoutCache {
  struct Key {
    float x, y, w, h, fs;
    int n, chunks;
    bool cells;
    bool operator==(const Key&) const = default;
  };
  Key key{};
  RingLayout layout;
};

const RingLayout& cached_ring_layout(RingLayoutCache& cache, ImVec2 p0, ImVec2 size, int n, int chunks, float fs, bool want_cells);

// Top-left of rank r's chunk cell c.
ImVec2 cell_pos(const RingLayout& L, int r, int c);

}  // namespace dtlab::app
