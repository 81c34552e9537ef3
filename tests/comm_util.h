// Helpers of the collective suites (test_comm, test_algorithms_i19), checked the nccl-tests way:
// rank r's input element i is a small integer, so float sums are exact, and every result is
// compared with a serial reference (#wrong must be 0).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

#include "engine/comm/threads_backend.h"

namespace dtlab::test {

// Rank r's input element i.
inline float value(int rank, int64_t i) { return static_cast<float>(rank + 1 + i % 7); }

// The serial reference: op over ranks 0..n-1 of value(q, i), in double.
inline double reference(ReduceOp op, int n, int64_t i) {
  double acc = op == ReduceOp::Max ? -1e30 : 0.0;
  for (int q = 0; q < n; q++) acc = op == ReduceOp::Max ? std::max(acc, double(value(q, i))) : acc + value(q, i);
  return op == ReduceOp::Avg ? acc / n : acc;
}

// #wrong: exact for sum and max; avg divides, so it may round like any float division.
template <class F>
int64_t count_wrong(const float* got, int64_t len, F expected, ReduceOp op = ReduceOp::Sum) {
  int64_t bad = 0;
  for (int64_t i = 0; i < len; i++) {
    double e = expected(i), tol = op == ReduceOp::Avg ? 1e-6 * std::abs(e) : 0.0;
    if (!(std::abs(double(got[i]) - e) <= tol)) bad++;
  }
  return bad;
}

inline std::vector<float> inputs(int rank, int64_t len) {
  std::vector<float> v(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; i++) v[static_cast<size_t>(i)] = value(rank, i);
  return v;
}

// Runs body on every rank of w; returns the #wrong summed over ranks.
inline int64_t run_counting(ThreadsWorld& w, const std::function<int64_t(int, Communicator&)>& body) {
  std::vector<int64_t> bad(static_cast<size_t>(w.world_size()), 0);
  w.run([&](int r, Communicator& c, RankContext&) { bad[static_cast<size_t>(r)] = body(r, c); });
  return std::accumulate(bad.begin(), bad.end(), int64_t{0});
}

// #wrong summed over ranks of a float all-reduce of `count` elements.
inline int64_t allreduce_wrong(ThreadsWorld& w, int64_t count, ReduceOp op, Algorithm algo) {
  return run_counting(w, [&](int r, Communicator& c) {
    std::vector<float> buf = inputs(r, count);
    c.all_reduce(buf.data(), count, DType::F32, op, algo)->wait();
    return count_wrong(buf.data(), count, [&](int64_t i) { return reference(op, w.world_size(), i); }, op);
  });
}

}  // namespace dtlab::test
