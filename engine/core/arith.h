// Small integer and interval helpers that several layers share (rings, trees, cost formulas).
#pragma once
#include <algorithm>

namespace dtlab {

// a mod n in [0, n) for any sign of a: the rank `a` steps around a ring of n.
constexpr int ring_mod(int a, int n) { return ((a % n) + n) % n; }

// ceil(log2 n), 0 for n <= 1: the rounds of a binomial tree (the ranks holding data double each round).
inline int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) k++;
  return k;
}

// The length of the overlap of [a0, a1] and [b0, b1] (0 when they are disjoint).
inline double overlap_of(double a0, double a1, double b0, double b1) {
  return std::max(0.0, std::min(a1, b1) - std::max(a0, b0));
}

}  // namespace dtlab
