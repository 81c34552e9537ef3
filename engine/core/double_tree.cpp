#include "engine/core/arith.h"
#include "engine/core/double_tree.h"

#include <algorithm>

namespace dtlab {

namespace {

// ncclGetBtree's in-order binary tree over ranks 0..n-1 rooted at 0 (our own code, same tree): a
// rank's lowest set bit `bit` says its level; its parent sets the next bit up (or, past the end,
// clears its own), its children are r -/+ bit/2 (the right one the nearest that exists).
void btree(int n, int r, int& parent, int child[2]) {
  int bit = 1;
  while (bit < n && !(bit & r)) bit <<= 1;
  child[0] = child[1] = -1;
  if (r == 0) {
    parent = -1;
    if (n > 1) child[0] = bit >> 1;
    return;
  }
  parent = (r ^ bit) | (bit << 1);
  if (parent >= n) parent = r ^ bit;
  const int low = bit >> 1;
  if (low == 0) return;
  child[0] = r - low;
  for (int l = low; l > 0; l >>= 1)
    if (r + l < n) {
      child[1] = r + l;
      break;
    }
}

// Tree `tree`'s links of rank r without heights: tree 1 relabels tree 0 (mirror or shift by one).
TreeLinks raw_links(int n, int tree, int r) {
  TreeLinks t;
  if (tree == 0) {
    btree(n, r, t.parent, t.child);
    return t;
  }
  const bool odd = n % 2 == 1;
  auto to0 = [&](int x) { return odd ? ring_mod(x - 1, n) : n - 1 - x; };
  auto from0 = [&](int x) { return x < 0 ? -1 : odd ? (x + 1) % n : n - 1 - x; };
  btree(n, to0(r), t.parent, t.child);
  t.parent = from0(t.parent);
  t.child[0] = from0(t.child[0]);
  t.child[1] = from0(t.child[1]);
  return t;
}

int subtree_height(int n, int tree, int r) {
  const TreeLinks t = raw_links(n, tree, r);
  int h = 0;
  for (int ch : t.child)
    if (ch >= 0) h = std::max(h, 1 + subtree_height(n, tree, ch));
  return h;
}

}  // namespace

TreeLinks double_tree_links(int n, int tree, int r) {
  TreeLinks t = raw_links(n, tree, r);
  t.height = subtree_height(n, tree, r);
  for (int p = t.parent; p >= 0; p = raw_links(n, tree, p).parent) t.depth++;
  return t;
}

int double_tree_root(int n, int tree) { return tree == 0 || n <= 1 ? 0 : n % 2 == 1 ? 1 : n - 1; }

int double_tree_parent(int n, int tree, int rank) { return double_tree_links(n, tree, rank).parent; }

}  // namespace dtlab
