#include "app/views/ring_layout.h"

#include <algorithm>
#include <cmath>

#include "app/views/vec2.h"

namespace dtlab::app {

namespace {

float node_radius(float ring_r, int n, float fs) {
  if (n <= 1) return fs * 1.8f;
  const float chord = 2.0f * ring_r * std::sin(kPi / static_cast<float>(n));
  return std::clamp(chord * 0.3f, fs * 0.6f, fs * 2.0f);
}

// Places nodes (rank 0 at the top, clockwise) and, just outside each, its cell block.
void place(RingLayout& L, int n) {
  L.node.assign(static_cast<size_t>(n), L.center);
  L.block.assign(static_cast<size_t>(n), L.center);
  const float off = L.cells ? L.node_r * 0.25f + 3.0f : 0.0f;
  for (int r = 0; r < n; r++) {
    const float a = -kPi / 2 + 2 * kPi * static_cast<float>(r) / static_cast<float>(n);
    const ImVec2 dir(std::cos(a), std::sin(a));
    const ImVec2 p = n == 1 ? L.center : L.center + dir * L.radius;
    L.node[static_cast<size_t>(r)] = p;
    if (!L.cells) continue;
    ImVec2 d = n == 1 ? ImVec2(0, 1) : dir;
    const float support = std::fabs(d.x) * L.block_size.x * 0.5f + std::fabs(d.y) * L.block_size.y * 0.5f;
    const ImVec2 bc = p + d * (L.node_r + off + support);
    L.block[static_cast<size_t>(r)] = bc - L.block_size * 0.5f;
  }
}

bool rects_overlap(ImVec2 a0, ImVec2 a1, ImVec2 b0, ImVec2 b1, float gap) {
  return a0.x < b1.x + gap && b0.x < a1.x + gap && a0.y < b1.y + gap && b0.y < a1.y + gap;
}

bool rect_hits_circle(ImVec2 a0, ImVec2 a1, ImVec2 c, float r) {
  const ImVec2 q(std::clamp(c.x, a0.x, a1.x), std::clamp(c.y, a0.y, a1.y));
  return length(q - c) < r;
}

// Fits ring, nodes and blocks of `cols` columns of `cell`-sized cells (no blocks when cell is 0) in
// the canvas; false when blocks would touch each other or other nodes.
bool fit_layout(RingLayout& L, ImVec2 p0, ImVec2 size, int n, int chunks, float fs, int cols, float cell) {
  L.center = p0 + size * 0.5f;
  const float pad = fs * 0.5f;
  L.cols = std::max(1, cols);
  L.rows = (chunks + L.cols - 1) / L.cols;
  L.cells = cell > 0;
  L.cell = cell;
  L.cell_gap = std::max(1.0f, cell * 0.12f);
  L.block_size = L.cells ? ImVec2(L.cols * cell + (L.cols - 1) * L.cell_gap, L.rows * cell + (L.rows - 1) * L.cell_gap) : ImVec2(0, 0);
  // Shrink the ring until every node and block lies inside the canvas.
  float R = std::min(size.x, size.y) * 0.5f;
  for (int it = 0; it < 6; it++) {
    L.radius = std::max(R, 1.0f);
    L.node_r = node_radius(L.radius, n, fs);
    place(L, n);
    float over = 0;
    for (int r = 0; r < n; r++) {
      const ImVec2 c = L.node[static_cast<size_t>(r)];
      ImVec2 lo(c.x - L.node_r, c.y - L.node_r), hi(c.x + L.node_r, c.y + L.node_r);
      if (L.cells) {
        const ImVec2 b = L.block[static_cast<size_t>(r)];
        lo = ImVec2(std::min(lo.x, b.x), std::min(lo.y, b.y));
        hi = ImVec2(std::max(hi.x, b.x + L.block_size.x), std::max(hi.y, b.y + L.block_size.y));
      }
      over = std::max({over, p0.x + pad - lo.x, p0.y + pad - lo.y, hi.x - (p0.x + size.x - pad), hi.y - (p0.y + size.y - pad)});
    }
    if (over <= 0.5f) break;
    R -= over + 1.0f;
  }
  if (!L.cells) return true;
  if (n > 1 && L.radius < L.node_r * 1.6f) return false;
  for (int i = 0; i < n; i++) {
    const ImVec2 a0 = L.block[static_cast<size_t>(i)], a1 = a0 + L.block_size;
    for (int j = 0; j < n; j++) {
      if (j != i && rect_hits_circle(a0, a1, L.node[static_cast<size_t>(j)], L.node_r + fs * 0.2f)) return false;
      const ImVec2 b0 = L.block[static_cast<size_t>(j)];
      if (j > i && rects_overlap(a0, a1, b0, b0 + L.block_size, fs * 0.3f)) return false;
    }
  }
  return true;
}

}  // namespace

RingLayout make_ring_layout(ImVec2 p0, ImVec2 size, int n, int chunks, float fs, bool want_cells) {
  RingLayout bare, L;
  fit_layout(bare, p0, size, n, chunks, fs, 1, 0.0f);
  if (!want_cells) return bare;
  for (float keep : {0.72f, 0.6f, 0.45f, 0.3f}) {
    RingLayout best;
    bool found = false;
    for (float cell = fs * (chunks == 1 ? 2.6f : 2.0f); cell >= fs * 0.42f && !found; cell *= 0.9f) {
      for (int rows : {1, 2, 4}) {
        if (rows > 1 && chunks < 2 * rows) continue;
        if (!fit_layout(L, p0, size, n, chunks, fs, (chunks + rows - 1) / rows, cell) || L.radius < keep * bare.radius) continue;
        if (!found || L.radius > best.radius) best = L;
        found = true;
      }
    }
    if (found) return best;
  }
  return bare;
}

const RingLayout& cached_ring_layout(RingLayoutCache& cache, ImVec2 p0, ImVec2 size, int n, int chunks, float fs, bool want_cells) {
  const RingLayoutCache::Key k{p0.x, p0.y, size.x, size.y, fs, n, chunks, want_cells};
  if (!(k == cache.key) || cache.layout.node.empty()) {
    cache.key = k;
    cache.layout = make_ring_layout(p0, size, n, chunks, fs, want_cells);
  }
  return cache.layout;
}

ImVec2 cell_pos(const RingLayout& L, int r, int c) {
  const ImVec2 b = L.block[static_cast<size_t>(r)];
  return ImVec2(b.x + static_cast<float>(c % L.cols) * (L.cell + L.cell_gap), b.y + static_cast<float>(c / L.cols) * (L.cell + L.cell_gap));
}

}  // namespace dtlab::app
