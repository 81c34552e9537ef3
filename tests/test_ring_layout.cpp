// The ring view's layout solver (app/views/ring_layout.h): plain geometry, checked without a window.
#include <doctest/doctest.h>

#ifdef DTLAB_HAVE_GUI
#include <algorithm>
#include <cmath>
#include <string>

#include "app/views/ring_layout.h"

using namespace dtlab::app;

namespace {

struct Box {
  float x0, y0, x1, y1;
};
bool inside(const Box& b, ImVec2 p0, ImVec2 size) {
  constexpr float kSlack = 1.0f;  // the solver stops shrinking the ring within half a pixel
  return b.x0 >= p0.x - kSlack && b.y0 >= p0.y - kSlack && b.x1 <= p0.x + size.x + kSlack && b.y1 <= p0.y + size.y + kSlack;
}
bool overlap(const Box& a, const Box& b) { return a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1; }
Box node_box(const RingLayout& L, int r) {
  const ImVec2 c = L.node[static_cast<size_t>(r)];
  return {c.x - L.node_r, c.y - L.node_r, c.x + L.node_r, c.y + L.node_r};
}
Box block_box(const RingLayout& L, int r) {
  const ImVec2 b = L.block[static_cast<size_t>(r)];
  return {b.x, b.y, b.x + L.block_size.x, b.y + L.block_size.y};
}
float dist(ImVec2 a, ImVec2 b) { return std::hypot(a.x - b.x, a.y - b.y); }

}  // namespace

TEST_SUITE("app") {
  TEST_CASE("ring layout: every rank's node and cells lie inside the canvas and none overlap, for 2 to 8 ranks") {
    const float fs = 16;
    for (const ImVec2 size : {ImVec2(800, 560), ImVec2(420, 300), ImVec2(260, 260)}) {
      const ImVec2 p0(30, 70);
      for (int n = 2; n <= 8; n++) {
        for (const int chunks : {1, n}) {
          CAPTURE(size.x);
          CAPTURE(size.y);
          CAPTURE(n);
          CAPTURE(chunks);
          const RingLayout L = make_ring_layout(p0, size, n, chunks, fs, true);
          REQUIRE(L.node.size() == static_cast<size_t>(n));
          REQUIRE(L.block.size() == static_cast<size_t>(n));
          if (size.x >= 800) CHECK(L.cells);  // a large canvas has room for the buffers
          CHECK(L.node[0].y < L.center.y);      // rank 0 at the top
          for (int r = 0; r < n; r++) {
            CHECK(inside(node_box(L, r), p0, size));
            if (L.cells) CHECK(inside(block_box(L, r), p0, size));
            for (int q = r + 1; q < n; q++) {
              CHECK(dist(L.node[static_cast<size_t>(r)], L.node[static_cast<size_t>(q)]) >= 2 * L.node_r);
              if (L.cells) CHECK_FALSE(overlap(block_box(L, r), block_box(L, q)));
            }
            if (L.cells && L.cols * L.rows >= chunks) {  // the last cell is in the rank's block
              const ImVec2 c = cell_pos(L, r, chunks - 1);
              const Box b = block_box(L, r);
              CHECK(c.x + L.cell <= b.x1 + 0.01f);
              CHECK(c.y + L.cell <= b.y1 + 0.01f);
            }
          }
        }
      }
    }
  }
}
#endif  // DTLAB_HAVE_GUI
