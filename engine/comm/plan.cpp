#include "engine/comm/plan.h"

namespace dtlab {

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) k++;
  return k;
}

void ring(std::vector<StepTransfer>& out, int n, RingPhase phase, bool reduce, int (*chunk)(int r, int s, int n), int s) {
  for (int r = 0; r < n; r++) out.push_back({mod(r - 1, n), r, chunk(r, s, n), phase, reduce});
}

// Binomial tree rooted at `root` (virtual rank v = r - root): broadcast step k sends from v to
// v + 2^k; reduce step k sends from v + 2^k to v for v a multiple of 2^(k+1).
void tree_broadcast(std::vector<StepTransfer>& out, int n, int root, int k) {
  const int half = 1 << k;
  for (int u = 0; u < half && u + half < n; u++)
    out.push_back({mod(u + root, n), mod(u + half + root, n), -1, RingPhase::Broadcast, false});
}

void tree_reduce(std::vector<StepTransfer>& out, int n, int root, int k) {
  const int half = 1 << k;
  for (int u = 0; u + half < n; u += 2 * half)
    out.push_back({mod(u + half + root, n), mod(u + root, n), -1, RingPhase::Reduce, true});
}

}  // namespace

int algorithm_step_count(CollectiveOp op, Algorithm algo, int n, int node_size) {
  (void)node_size;
  if (n <= 1) return 0;
  switch (op) {
    case CollectiveOp::AllReduce: return algo == Algorithm::Tree ? 2 * ceil_log2(n) : 2 * (n - 1);
    case CollectiveOp::ReduceScatter:
    case CollectiveOp::AllGather:
    case CollectiveOp::AllToAll: return n - 1;
    case CollectiveOp::Broadcast:
    case CollectiveOp::Reduce: return algo == Algorithm::Naive ? n - 1 : ceil_log2(n);
    default: return 0;
  }
}

std::vector<StepTransfer> algorithm_step_plan(CollectiveOp op, Algorithm algo, int n, int root, int s, int node_size) {
  (void)node_size;
  std::vector<StepTransfer> out;
  if (s < 0 || s >= algorithm_step_count(op, algo, n)) return out;
  switch (op) {
    case CollectiveOp::AllReduce:
      if (algo == Algorithm::Ring) {
        // Reduce-scatter: rank r adds its predecessor's chunk (r - 2 - s); after n - 1 steps chunk r
        // is final on rank r. All-gather: the final chunks travel on round the ring.
        if (s < n - 1) ring(out, n, RingPhase::ReduceScatter, true, [](int r, int st, int m) { return mod(r - 2 - st, m); }, s);
        else ring(out, n, RingPhase::AllGather, false, [](int r, int st, int m) { return mod(r - 1 - (st - (m - 1)), m); }, s);
      } else if (algo == Algorithm::Naive) {
        // Rank 0 gathers and reduces every buffer, then sends the result to each rank in turn.
        if (s < n - 1) out.push_back({s + 1, 0, -1, RingPhase::Gather, true});
        else out.push_back({0, s - (n - 1) + 1, -1, RingPhase::Broadcast, false});
      } else {
        const int L = ceil_log2(n);
        if (s < L) tree_reduce(out, n, 0, s);
        else tree_broadcast(out, n, 0, s - L);
      }
      break;
    case CollectiveOp::ReduceScatter:
      ring(out, n, RingPhase::ReduceScatter, true, [](int r, int st, int m) { return mod(r - 2 - st, m); }, s);
      break;
    case CollectiveOp::AllGather:
      ring(out, n, RingPhase::AllGather, false, [](int r, int st, int m) { return mod(r - 1 - st, m); }, s);
      break;
    case CollectiveOp::Broadcast:
      if (algo == Algorithm::Naive) out.push_back({root, mod(root + s + 1, n), -1, RingPhase::Broadcast, false});
      else tree_broadcast(out, n, root, s);
      break;
    case CollectiveOp::Reduce:
      if (algo == Algorithm::Naive) out.push_back({mod(root + s + 1, n), root, -1, RingPhase::Gather, true});
      else tree_reduce(out, n, root, s);
      break;
    case CollectiveOp::AllToAll:
      for (int r = 0; r < n; r++) out.push_back({mod(r - (s + 1), n), r, mod(r - (s + 1), n), RingPhase::None, false});
      break;
    default: break;
  }
  return out;
}

}  // namespace dtlab
