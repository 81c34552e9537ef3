#include "engine/comm/plan.h"

#include <algorithm>
#include <string>

#include "engine/comm/ring_order.h"
#include "engine/core/arith.h"
#include "engine/core/check.h"

namespace dtlab {

namespace {

// Every rank takes chunk(r, s, n) (ring_order.h) from its predecessor.
void ring(std::vector<StepTransfer>& out, int n, RingPhase phase, bool reduce, int (*chunk)(int r, int s, int n), int s) {
  for (int r = 0; r < n; r++) out.push_back({ring_pred(r, n), r, chunk(r, s, n), phase, reduce, n});
}

// Binomial tree rooted at `root` (virtual rank v = r - root): broadcast step k sends from v to
// v + 2^k; reduce step k sends from v + 2^k to v for v a multiple of 2^(k+1).
void tree_broadcast(std::vector<StepTransfer>& out, int n, int root, int k) {
  const int half = 1 << k;
  for (int u = 0; u < half && u + half < n; u++)
    out.push_back({ring_mod(u + root, n), ring_mod(u + half + root, n), -1, RingPhase::Broadcast, false});
}

void tree_reduce(std::vector<StepTransfer>& out, int n, int root, int k) {
  const int half = 1 << k;
  for (int u = 0; u + half < n; u += 2 * half)
    out.push_back({ring_mod(u + half + root, n), ring_mod(u + root, n), -1, RingPhase::Reduce, true});
}

// Double binary tree step s (both trees at once). Reduce phase (K + H - 1 steps): a rank of height
// h sends chunk c to its parent at step c + h, when its children's parts of c are in. Broadcast
// phase (as many): the root's chunk c reaches depth d at that phase's step c + d - 1.
void double_tree(std::vector<StepTransfer>& out, int n, int s) {
  const int K = kPipelineChunks, H = ceil_log2(n), up = K + H - 1;
  for (int tree = 0; tree < 2; tree++)
    for (int r = 0; r < n; r++) {
      const TreeLinks t = double_tree_links(n, tree, r);
      if (t.parent < 0) continue;
      const int c = s < up ? s - t.height : s - up - (t.depth - 1);
      if (c < 0 || c >= K) continue;
      if (s < up) out.push_back({r, t.parent, tree * K + c, RingPhase::Reduce, true, 2 * K});
      else out.push_back({t.parent, r, tree * K + c, RingPhase::Broadcast, false, 2 * K});
    }
}

// Hierarchical step s: a ring reduce-scatter inside every node (G - 1 steps, chunk k of G), a ring
// all-reduce between the ranks of the same local index on their shard l (2 (N - 1) steps, piece j
// of the shard is chunk l N + j of G N), a ring all-gather inside every node (G - 1 steps); each
// ring in ring_order.h's order, the node's over local index l, the one across nodes over node m.
void hierarchical(std::vector<StepTransfer>& out, int n, int G, int s) {
  const int N = n / G;
  for (int m = 0; m < N; m++)
    for (int l = 0; l < G; l++) {
      const int r = m * G + l;
      int t = s;
      if (t < G - 1) {
        out.push_back({m * G + ring_pred(l, G), r, ring_rs_recv_chunk(l, t, G), RingPhase::ReduceScatter, true, G});
        continue;
      }
      t -= G - 1;
      const int across = ring_pred(m, N) * G + l;
      if (t < N - 1) {
        out.push_back({across, r, l * N + ring_rs_recv_chunk(m, t, N), RingPhase::ReduceScatter, true, G * N});
        continue;
      }
      t -= N - 1;
      if (t < N - 1) {
        out.push_back({across, r, l * N + ring_ag_recv_chunk(m, t, N), RingPhase::AllGather, false, G * N});
        continue;
      }
      t -= N - 1;
      out.push_back({m * G + ring_pred(l, G), r, ring_ag_recv_chunk(l, t, G), RingPhase::AllGather, false, G});
    }
}

// In-network step s: every rank sends chunk s to the switch (which reduces it) and receives the
// reduced chunk s - 1 back.
void in_network(std::vector<StepTransfer>& out, int n, int s) {
  const int K = kPipelineChunks;
  for (int r = 0; r < n && s < K; r++) out.push_back({r, kNetworkSwitch, s, RingPhase::Reduce, true, K});
  for (int r = 0; r < n && s >= 1; r++) out.push_back({kNetworkSwitch, r, s - 1, RingPhase::Broadcast, false, K});
}

}  // namespace

std::pair<int64_t, int64_t> transfer_elements(const StepTransfer& t, int64_t count) {
  if (t.chunk < 0 || t.chunks <= 0) return {0, count};
  return {chunk_begin(count, t.chunks, t.chunk), chunk_begin(count, t.chunks, t.chunk + 1)};
}

int planned_chunks(Algorithm algo, int n, int node_size) {
  (void)node_size;  // hierarchical's pieces are G x N = world whatever the node size
  if (n <= 1) return 0;
  if (algo == Algorithm::DoubleTree) return 2 * kPipelineChunks;
  if (algo == Algorithm::Hierarchical) return n;
  if (algo == Algorithm::InNetwork) return kPipelineChunks;
  return 0;
}

std::pair<int, int> fine_chunks(const StepTransfer& t, int chunks) {
  if (t.chunk < 0 || t.chunks <= 0) return {0, chunks};
  const int per = std::max(1, chunks / t.chunks);
  return {t.chunk * per, (t.chunk + 1) * per};
}

RingStepWork ring_allreduce_step(int r, int s, int n) {
  const bool rs = s < n - 1;
  RingStepWork w;
  w.transfer = {ring_pred(r, n), r, ring_allreduce_recv_chunk(r, s, n), rs ? RingPhase::ReduceScatter : RingPhase::AllGather,
                rs, n};
  w.finishes = s == n - 2;
  return w;
}

int hierarchical_node_size(int n, int node_size) { return node_size <= 0 || node_size >= n ? n : node_size; }

int algorithm_step_count(CollectiveOp op, Algorithm algo, int n, int node_size) {
  if (n <= 1) return 0;
  switch (op) {
    case CollectiveOp::AllReduce:
      switch (algo) {
        case Algorithm::Tree: return 2 * ceil_log2(n);
        case Algorithm::DoubleTree: return 2 * (kPipelineChunks + ceil_log2(n) - 1);
        case Algorithm::InNetwork: return kPipelineChunks + 1;
        case Algorithm::Hierarchical: {
          const int G = hierarchical_node_size(n, node_size);
          return n % G != 0 ? 0 : 2 * (G - 1) + 2 * (n / G - 1);
        }
        default: return 2 * (n - 1);
      }
    case CollectiveOp::ReduceScatter:
    case CollectiveOp::AllGather: return n - 1;
    case CollectiveOp::AllToAll: return algo == Algorithm::Grouped ? 1 : n - 1;
    case CollectiveOp::Broadcast:
    case CollectiveOp::Reduce: return algo == Algorithm::Naive ? n - 1 : ceil_log2(n);
    default: return 0;
  }
}

std::vector<StepTransfer> algorithm_step_plan(CollectiveOp op, Algorithm algo, int n, int root, int s, int node_size) {
  std::vector<StepTransfer> out;
  if (s < 0 || s >= algorithm_step_count(op, algo, n, node_size)) return out;
  switch (op) {
    case CollectiveOp::AllReduce:
      if (algo == Algorithm::DoubleTree) {
        double_tree(out, n, s);
      } else if (algo == Algorithm::Hierarchical) {
        hierarchical(out, n, hierarchical_node_size(n, node_size), s);
      } else if (algo == Algorithm::InNetwork) {
        in_network(out, n, s);
      } else if (algo == Algorithm::Ring) {
        for (int r = 0; r < n; r++) out.push_back(ring_allreduce_step(r, s, n).transfer);
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
      ring(out, n, RingPhase::ReduceScatter, true, ring_rs_recv_chunk, s);
      break;
    case CollectiveOp::AllGather:
      ring(out, n, RingPhase::AllGather, false, ring_ag_recv_chunk, s);
      break;
    case CollectiveOp::Broadcast:
      if (algo == Algorithm::Naive) out.push_back({root, ring_mod(root + s + 1, n), -1, RingPhase::Broadcast, false});
      else tree_broadcast(out, n, root, s);
      break;
    case CollectiveOp::Reduce:
      if (algo == Algorithm::Naive) out.push_back({ring_mod(root + s + 1, n), root, -1, RingPhase::Gather, true});
      else tree_reduce(out, n, root, s);
      break;
    case CollectiveOp::AllToAll:
      if (algo == Algorithm::Grouped) {  // one step: every rank receives its block from each other rank
        for (int r = 0; r < n; r++)
          for (int k = 1; k < n; k++) out.push_back({ring_mod(r - k, n), r, ring_mod(r - k, n), RingPhase::None, false, n});
        break;
      }
      for (int r = 0; r < n; r++) out.push_back({ring_mod(r - (s + 1), n), r, ring_mod(r - (s + 1), n), RingPhase::None, false, n});
      break;
    default: break;
  }
  return out;
}

void check_algorithm_topology(Algorithm algo, int n, const HardwareProfile& p) {
  if (algo == Algorithm::Hierarchical && p.gpus_per_node > 1 && p.gpus_per_node < n && n % p.gpus_per_node != 0) {
    const int G = p.gpus_per_node;
    throw Error("hierarchical all-reduce needs whole nodes: world " + std::to_string(n) + " is not a multiple of profile '" +
                p.name + "''s " + std::to_string(G) + " GPUs per node; use a world of " + std::to_string(G) + ", " +
                std::to_string(2 * G) + ", ... or another algorithm");
  }
  if (algo == Algorithm::InNetwork && !p.switch_reduces) {
    std::string names;
    for (const HardwareProfile& q : builtin_profiles())
      if (q.switch_reduces) names += (names.empty() ? "" : ", ") + q.name;
    throw Error("in-network all-reduce (nvls) needs a switch that reduces (NVLink SHARP or InfiniBand SHARP) and profile '" +
                p.name + "' has none; " +
                (names.empty() ? std::string("no built-in profile has one yet, so use") : "use a profile that has one (" + names + ") or") +
                " another algorithm");
  }
}

}  // namespace dtlab
