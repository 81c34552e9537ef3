// The collective algorithms of the threads backend, one rank's part each, step by step.
//
// Ring (all-reduce, reduce-scatter, all-gather) follows NCCL's chunk order (docs/course_sources.md §6),
// which ring_order.h writes down for the plans, the process groups and these algorithms alike:
// each step a rank reduces (or copies) one chunk from its predecessor, and after the reduce-scatter
// chunk r is final on rank r. The receiver reads the predecessor's chunk in place (a fused
// receive-reduce: no staging copy) and two counters per rank keep the ring safe without a global
// barrier: done (what a rank has finished, so its successor may read it) and consumed (what its
// successor has finished reading, so it may overwrite it). All-reduce cuts each step into slices
// (as NCCL does) so a successor reduces a slice while it is still in cache and all ranks stay busy.
//
// Tree (binomial broadcast and reduce) and naive (gather to rank 0, then send back) are the
// teaching comparisons; each of their steps ends in a barrier of all ranks. So do the steps of the
// double binary tree, hierarchical and in-network all-reduces, which run their plan (plan.h).
#include <algorithm>
#include <cstring>

#include "engine/comm/plan.h"
#include "engine/comm/reduce_kernels.h"
#include "engine/comm/ring_order.h"
#include "engine/comm/threads_internal.h"

namespace dtlab::threads {

namespace {

std::vector<std::pair<int, int>> ring_pairs(int n) {
  std::vector<std::pair<int, int>> v;
  for (int r = 0; r < n; r++) v.push_back({r, ring_succ(r, n)});
  return v;
}

// Shared step plumbing: gate, timing, event.
struct Stepper_ {
  Call& c;
  World& w;
  explicit Stepper_(Call& call) : c(call), w(*call.world) {}
  int64_t begin(int step) {
    if (!w.step_gate(c, step)) w.fail_aborted();
    return w.recorder_->now_ns();
  }
};

template <class T>
T* as(void* p) { return static_cast<T*>(p); }
template <class T>
const T* as(const void* p) { return static_cast<const T*>(p); }

// Every byte moves through the world's DataMover (host memory, or a device for the cuda backend),
// on behalf of the rank running this part of the algorithm.
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::F32;
  else if constexpr (std::is_same_v<T, Bf16Bits>) return DType::BF16;
  else if constexpr (std::is_same_v<T, Fp16Bits>) return DType::F16;
  else return DType::I64;
}
template <class T>
void copy_elems(Call& c, T* dst, const T* src, int64_t len) {
  if (len > 0 && dst != src) c.world->mover_->copy(c.rank, dst, src, len * static_cast<int64_t>(sizeof(T)));
}
template <class T>
void reduce_into(Call& c, T* dst, const T* src, int64_t len, ReduceOp op) {
  c.world->mover_->reduce_into(c.rank, dst, src, len, dtype_of<T>(), op);
}
template <class T>
void reduce_to(Call& c, T* dst, const T* a, const T* b, int64_t len, ReduceOp op) {
  c.world->mover_->reduce_to(c.rank, dst, a, b, len, dtype_of<T>(), op);
}
template <class T>
void finish_avg(Call& c, T* buf, int64_t len, ReduceOp op, int n) {
  c.world->mover_->finish_avg(c.rank, buf, len, dtype_of<T>(), op, n);
}

// ---- ring ----

// One rank's part of a ring collective: its step plumbing, its ring position (n ranks, this one r,
// its predecessor pred), the element count, the ring's links and this rank's output buffer.
template <class T>
struct RingRank_ {
  Stepper_ st;
  Rendezvous& rv;
  const int n, r, pred;
  const int64_t count;
  const std::vector<std::pair<int, int>> pairs;
  T* out;
  explicit RingRank_(Call& c)
      : st(c), rv(*c.rv), n(c.n), r(c.rank), pred(ring_pred(c.rank, c.n)), count(c.rv->desc.count),
        pairs(ring_pairs(c.n)), out(as<T>(c.rv->buf[static_cast<size_t>(c.rank)])) {}
};

template <class T>
void ring_allreduce(Call& c) {
  RingRank_<T> rank(c);
  auto& [st, rv, n, r, pred, count, pairs, mine] = rank;
  const int J = rv.slices;
  const int64_t slice = (chunk_begin(count, n, 1) + 1 + J - 1) / J;  // elements per slice
  const double chunk_bytes = static_cast<double>(count * sizeof(T)) / n;  // the model's n/p
  const T* theirs = as<T>(rv.buf[static_cast<size_t>(pred)]);
  for (int s = 0; s < rv.steps; s++) {
    int64_t wall0 = st.begin(s);
    // The plan's step (plan.h), one fused reduce-copy per slice: reduce (or, in the all-gather, copy)
    // the predecessor's chunk in place, dividing for Avg in the same pass where the chunk is final.
    const RingStepWork work = ring_allreduce_step(r, s, n);
    const bool rs = work.transfer.reduce;
    const int k = work.transfer.chunk;
    const auto [lo, hi] = transfer_elements(work.transfer, count);
    for (int j = 0; j < J; j++) {
      const int64_t unit = static_cast<int64_t>(s) * J + j;
      st.w.ring_wait_ready(c, unit);
      const int64_t a = std::min(hi, lo + j * slice), b = std::min(hi, a + slice);
      if (b > a) c.world->mover_->reduce_copy(c.rank, mine + a, theirs + a, b - a, dtype_of<T>(), rv.desc.reduce, rs,
                                              work.finishes ? n : 0);
      st.w.ring_mark_done(c, unit);
    }
    st.w.finish_step(c, s, rs ? RingPhase::ReduceScatter : RingPhase::AllGather, k, pred, r,
                     (hi - lo) * static_cast<int64_t>(sizeof(T)), pairs, chunk_bytes, rs, wall0);
  }
  st.w.ring_wait_drained(c);
}

template <class T>
void ring_reduce_scatter(Call& c) {
  RingRank_<T> rank(c);
  auto& [st, rv, n, r, pred, count, pairs, out] = rank;
  const T* in = as<T>(rv.in[static_cast<size_t>(r)]);
  if (n == 1) {
    copy_elems(c, out, in, count);
    finish_avg(c, out, count, rv.desc.reduce, 1);
    return;
  }
  // Two partial-sum slots: the one written at step s, the one the successor reads at step s.
  c.scratch.push_back(c.world->mover_->scratch(r, 2 * std::max<int64_t>(count, 1) * static_cast<int64_t>(sizeof(T)),
                                               c.ctx->memory()));
  CommScratch* scratch = c.scratch.back().get();
  {
    std::lock_guard<std::mutex> lock(st.w.mu_);
    rv.scratch[static_cast<size_t>(r)] = scratch->data();
  }
  const T* pred_in = as<T>(rv.in[static_cast<size_t>(pred)]);
  for (int s = 0; s < rv.steps; s++) {
    int64_t wall0 = st.begin(s);
    st.w.ring_wait_ready(c, s);
    const int k = ring_rs_recv_chunk(r, s, n);
    // From step 1 on the predecessor's partial sums are in its scratch, whose pointer it published
    // under the lock before finishing step 0 (so ring_wait_ready ordered this read after it).
    const T* src = s == 0 ? pred_in + k * count
                          : as<T>(static_cast<const void*>(rv.scratch[static_cast<size_t>(pred)])) + ((s - 1) % 2) * count;
    T* dst = s == n - 2 ? out : as<T>(scratch->data()) + (s % 2) * count;
    reduce_to(c, dst, in + k * count, src, count, rv.desc.reduce);
    if (s == n - 2) finish_avg(c, out, count, rv.desc.reduce, n);
    st.w.ring_mark_done(c, s);
    st.w.finish_step(c, s, RingPhase::ReduceScatter, k, pred, r, count * static_cast<int64_t>(sizeof(T)),
                     pairs, static_cast<double>(count * sizeof(T)), true, wall0);
  }
  st.w.ring_wait_drained(c);  // the successor has read our scratch: now it may go
}

template <class T>
void ring_all_gather(Call& c) {
  RingRank_<T> rank(c);
  auto& [st, rv, n, r, pred, count, pairs, out] = rank;
  copy_elems(c, out + r * count, as<T>(rv.in[static_cast<size_t>(r)]), count);  // never read by others
  const T* pred_in = as<T>(rv.in[static_cast<size_t>(pred)]);
  const T* pred_out = as<T>(static_cast<const void*>(rv.buf[static_cast<size_t>(pred)]));
  for (int s = 0; s < rv.steps; s++) {
    int64_t wall0 = st.begin(s);
    st.w.ring_wait_ready(c, s);
    const int k = ring_ag_recv_chunk(r, s, n);
    copy_elems(c, out + k * count, s == 0 ? pred_in : pred_out + k * count, count);
    st.w.ring_mark_done(c, s);
    st.w.finish_step(c, s, RingPhase::AllGather, k, pred, r, count * static_cast<int64_t>(sizeof(T)),
                     pairs, static_cast<double>(count * sizeof(T)), false, wall0);
  }
  st.w.ring_wait_drained(c);
}

// ---- tree (binomial) ----

// Binomial broadcast of `count` elements from `root`, reading each sender's `bufs` entry in place.
template <class T>
void tree_broadcast_steps(Call& c, int root, int first_step, std::vector<void*>& bufs) {
  Stepper_ st(c);
  const int n = c.n, r = c.rank, v = ring_mod(r - root, n);
  const int64_t count = c.rv->desc.count;
  const double bytes = static_cast<double>(count * sizeof(T));
  for (int k = 0; k < ceil_log2(n); k++) {
    const int half = 1 << k, s = first_step + k;
    int64_t wall0 = st.begin(s);
    std::vector<std::pair<int, int>> pairs;
    for (int u = 0; u < half && u + half < n; u++) pairs.push_back({ring_mod(u + root, n), ring_mod(u + half + root, n)});
    int src = -1;
    if (v >= half && v < 2 * half) {
      src = ring_mod(v - half + root, n);
      copy_elems(c, as<T>(bufs[static_cast<size_t>(r)]), as<T>(static_cast<const void*>(bufs[static_cast<size_t>(src)])), count);
    }
    st.w.step_barrier(c);
    st.w.finish_step(c, s, RingPhase::Broadcast, -1, src, src >= 0 ? r : -1,
                     src >= 0 ? count * static_cast<int64_t>(sizeof(T)) : 0, pairs, bytes, false, wall0);
  }
}

// Binomial reduce into `root`; non-root ranks accumulate in scratch so their buffers stay unchanged.
template <class T>
void tree_reduce_steps(Call& c, int root) {
  Stepper_ st(c);
  Rendezvous& rv = *c.rv;
  const int n = c.n, r = c.rank, v = ring_mod(r - root, n);
  const int64_t count = rv.desc.count;
  const double bytes = static_cast<double>(count * sizeof(T));
  void* acc = rv.buf[static_cast<size_t>(r)];
  if (v != 0) {
    c.scratch.push_back(c.world->mover_->scratch(r, (std::max<int64_t>(count, 1) * static_cast<int64_t>(sizeof(T)) / 4 + 1) * 4,
                                                 c.ctx->memory()));
    copy_elems(c, as<T>(c.scratch.back()->data()), as<T>(static_cast<const void*>(acc)), count);
    acc = c.scratch.back()->data();
  }
  {
    std::lock_guard<std::mutex> lock(st.w.mu_);
    rv.scratch[static_cast<size_t>(r)] = acc;
  }
  st.w.step_barrier(c);  // every accumulator is in place before the first step reads one
  for (int k = 0; k < ceil_log2(n); k++) {
    const int half = 1 << k;
    int64_t wall0 = st.begin(k);
    std::vector<std::pair<int, int>> pairs;
    for (int u = 0; u + half < n; u += 2 * half) pairs.push_back({ring_mod(u + half + root, n), ring_mod(u + root, n)});
    int src = -1;
    if (v % (2 * half) == 0 && v + half < n) {
      src = ring_mod(v + half + root, n);
      reduce_into(c, as<T>(acc), as<T>(static_cast<const void*>(rv.scratch[static_cast<size_t>(src)])), count, rv.desc.reduce);
    }
    st.w.step_barrier(c);
    st.w.finish_step(c, k, RingPhase::Reduce, -1, src, src >= 0 ? r : -1,
                     src >= 0 ? count * static_cast<int64_t>(sizeof(T)) : 0, pairs, bytes, true, wall0);
  }
  if (v == 0) finish_avg(c, as<T>(acc), count, rv.desc.reduce, n);
}

// ---- naive ----

// The naive algorithms, one message per step between the root and each other rank in turn:
// gather (toward the root, which reduces or just receives each buffer) or send (from the root,
// each other rank copying the root's buffer).
template <class T>
void naive_steps(Call& c, int root, bool gather, bool reduce, int first_step) {
  Stepper_ st(c);
  Rendezvous& rv = *c.rv;
  const int n = c.n, r = c.rank;
  const int64_t count = rv.desc.count;
  for (int i = 1; i < n; i++) {
    const int s = first_step + i - 1, other = ring_mod(root + i, n);
    const int src = gather ? other : root, dst = gather ? root : other;
    int64_t wall0 = st.begin(s);
    T* mine = as<T>(rv.buf[static_cast<size_t>(r)]);
    const T* theirs = as<T>(static_cast<const void*>(rv.buf[static_cast<size_t>(src)]));
    if (r == dst && gather) reduce_into(c, mine, theirs, count, rv.desc.reduce);
    if (r == dst && !gather) copy_elems(c, mine, theirs, count);
    st.w.step_barrier(c);
    st.w.finish_step(c, s, gather ? RingPhase::Gather : RingPhase::Broadcast, -1, src, dst,
                     r == dst ? count * static_cast<int64_t>(sizeof(T)) : 0, {{src, dst}},
                     static_cast<double>(count * sizeof(T)), reduce, wall0);
  }
}

// Root takes each other rank's buffer in turn (reducing or just receiving).
template <class T>
void naive_gather_steps(Call& c, int root, bool reduce, int first_step) {
  naive_steps<T>(c, root, true, reduce, first_step);
}

template <class T>
void naive_send_steps(Call& c, int root, int first_step) {
  naive_steps<T>(c, root, false, false, first_step);
}

// Pairwise exchange: round s, every rank sends to r + s and receives from r - s. Grouped (NCCL's
// one group of sends and receives): one step in which every block moves.
template <class T>
void all_to_all(Call& c) {
  Stepper_ st(c);
  Rendezvous& rv = *c.rv;
  const int n = c.n, r = c.rank;
  const int64_t count = rv.desc.count;
  T* out = as<T>(rv.buf[static_cast<size_t>(r)]);
  copy_elems(c, out + r * count, as<T>(rv.in[static_cast<size_t>(r)]) + r * count, count);
  if (rv.desc.algo == Algorithm::Grouped) {
    const int64_t wall0 = st.begin(0);
    for (int k = 1; k < n; k++) {
      const int src = ring_mod(r - k, n);
      copy_elems(c, out + src * count, as<T>(rv.in[static_cast<size_t>(src)]) + r * count, count);
    }
    st.w.step_barrier(c);
    st.w.finish_plan_step(c, 0, algorithm_step_plan(CollectiveOp::AllToAll, Algorithm::Grouped, n, -1, 0), wall0);
    return;
  }
  for (int s = 1; s < n; s++) {
    int64_t wall0 = st.begin(s - 1);
    const int src = ring_mod(r - s, n);
    copy_elems(c, out + src * count, as<T>(rv.in[static_cast<size_t>(src)]) + r * count, count);
    std::vector<std::pair<int, int>> pairs;
    for (int u = 0; u < n; u++) pairs.push_back({u, ring_mod(u + s, n)});
    st.w.step_barrier(c);
    st.w.finish_step(c, s - 1, RingPhase::None, src, src, r, count * static_cast<int64_t>(sizeof(T)), pairs,
                     static_cast<double>(count * sizeof(T)), false, wall0);
  }
}

// ---- planned all-reduces: double binary tree, hierarchical, in-network ----

// Where rank r's result becomes final at step s, so finish_avg divides it then: the root of a
// double-tree chunk once its last child's part is in; under hierarchical the shard piece the rank
// owns at the end of the reduce-scatters. Chunk -1: nothing this step.
StepTransfer finished_at(Algorithm algo, int n, int G, int r, int s) {
  StepTransfer f;
  if (algo == Algorithm::DoubleTree) {
    const int K = kPipelineChunks, c = s - (ceil_log2(n) - 1);
    for (int tree = 0; tree < 2; tree++)
      if (r == double_tree_root(n, tree) && c >= 0 && c < K) f.chunk = tree * K + c, f.chunks = 2 * K;
  } else if (algo == Algorithm::Hierarchical) {
    const int N = n / G;
    if (s == (G - 1) + (N - 1) - 1) f.chunk = (r % G) * N + r / G, f.chunks = G * N;
  }
  return f;
}

// The switch's arithmetic for chunk `t`, done on the rank threads: rank r reduces slice r of the
// chunk over every rank's buffer, in rank order (deterministic), into the switch buffer.
template <class T>
void switch_reduce(Call& c, T* sw, int t) {
  Rendezvous& rv = *c.rv;
  const int n = c.n;
  const auto [lo, hi] = transfer_elements({0, kNetworkSwitch, t, RingPhase::Reduce, true, kPipelineChunks}, rv.desc.count);
  const int64_t a = lo + chunk_begin(hi - lo, n, c.rank), b = lo + chunk_begin(hi - lo, n, c.rank + 1);
  auto buf = [&](int q) { return as<T>(static_cast<const void*>(rv.buf[static_cast<size_t>(q)])) + a; };
  reduce_to(c, sw + a, buf(0), buf(1), b - a, rv.desc.reduce);
  for (int q = 2; q < n; q++) reduce_into(c, sw + a, buf(q), b - a, rv.desc.reduce);
  finish_avg(c, sw + a, b - a, rv.desc.reduce, n);
}

// Runs the algorithm's plan (plan.h) step by step: each rank takes the transfers into it (reducing
// into or copying over its own buffer, in place: no step reads a chunk another transfer of the same
// step writes), then every rank meets at a barrier before the next step.
template <class T>
void planned_allreduce(Call& c) {
  Stepper_ st(c);
  Rendezvous& rv = *c.rv;
  const CollDesc& d = rv.desc;
  const int n = c.n, r = c.rank, G = hierarchical_node_size(n, rv.node_size);
  T* mine = as<T>(rv.buf[static_cast<size_t>(r)]);
  T* sw = nullptr;  // the switch's buffer (in-network), owned by rank 0's call
  if (d.algo == Algorithm::InNetwork) {
    if (r == 0) {
      c.scratch.push_back(c.world->mover_->scratch(r, std::max<int64_t>(d.count, 1) * static_cast<int64_t>(sizeof(T)),
                                                   c.ctx->memory()));
      std::lock_guard<std::mutex> lock(st.w.mu_);
      rv.scratch[0] = c.scratch.back()->data();
    }
    st.w.step_barrier(c);
    std::lock_guard<std::mutex> lock(st.w.mu_);
    sw = as<T>(rv.scratch[0]);
  }
  for (int s = 0; s < rv.steps; s++) {
    const int64_t wall0 = st.begin(s);
    const std::vector<StepTransfer> plan = algorithm_step_plan(d.op, d.algo, n, 0, s, rv.node_size);
    for (const StepTransfer& t : plan) {
      if (t.dst != r) continue;
      const auto [lo, hi] = transfer_elements(t, d.count);
      const T* from = t.src == kNetworkSwitch ? sw : as<T>(static_cast<const void*>(rv.buf[static_cast<size_t>(t.src)]));
      if (t.reduce) reduce_into(c, mine + lo, from + lo, hi - lo, d.reduce);
      else copy_elems(c, mine + lo, from + lo, hi - lo);
    }
    if (sw && s < kPipelineChunks) switch_reduce(c, sw, s);
    const StepTransfer fin = finished_at(d.algo, n, G, r, s);
    if (fin.chunk >= 0) {
      const auto [lo, hi] = transfer_elements(fin, d.count);
      finish_avg(c, mine + lo, hi - lo, d.reduce, n);
    }
    st.w.step_barrier(c);  // this step's reads are done before the next step writes
    st.w.finish_plan_step(c, s, plan, wall0);
  }
}

template <class T>
void dispatch(Call& c) {
  const CollDesc& d = c.rv->desc;
  if (c.n == 1) {  // nothing moves; out-of-place ops still copy, avg divides by one
    if (collective_traits(d.op).out_of_place) copy_elems(c, as<T>(c.rv->buf[0]), as<T>(c.rv->in[0]), d.count);
    return;
  }
  switch (d.op) {
    case CollectiveOp::AllReduce:
      if (d.algo == Algorithm::Ring) return ring_allreduce<T>(c);
      if (d.algo == Algorithm::DoubleTree || d.algo == Algorithm::Hierarchical || d.algo == Algorithm::InNetwork)
        return planned_allreduce<T>(c);
      if (d.algo == Algorithm::Naive) {
        naive_gather_steps<T>(c, 0, true, 0);
        if (c.rank == 0) finish_avg(c, as<T>(c.rv->buf[0]), d.count, d.reduce, c.n);
        c.world->step_barrier(c);  // rank 0's average is final before anyone copies it
        return naive_send_steps<T>(c, 0, c.n - 1);
      } else {
        tree_reduce_steps<T>(c, 0);
        c.world->step_barrier(c);  // rank 0's result is final before anyone reads it
        return tree_broadcast_steps<T>(c, 0, ceil_log2(c.n), c.rv->buf);
      }
    case CollectiveOp::ReduceScatter: return ring_reduce_scatter<T>(c);
    case CollectiveOp::AllGather: return ring_all_gather<T>(c);
    case CollectiveOp::Broadcast:
      if (d.algo == Algorithm::Naive) return naive_send_steps<T>(c, d.root, 0);
      return tree_broadcast_steps<T>(c, d.root, 0, c.rv->buf);
    case CollectiveOp::Reduce:
      if (d.algo == Algorithm::Naive) {
        naive_gather_steps<T>(c, d.root, true, 0);
        if (c.rank == d.root) finish_avg(c, as<T>(c.rv->buf[static_cast<size_t>(d.root)]), d.count, d.reduce, c.n);
        return;
      } else {
        tree_reduce_steps<T>(c, d.root);
        c.world->step_barrier(c);  // every reader of our accumulator (kept in c.scratch) is done
        return;
      }
    case CollectiveOp::AllToAll: return all_to_all<T>(c);
    case CollectiveOp::Barrier: return;
    default: return;
  }
}

}  // namespace

int algorithm_steps(const CollDesc& d, int n, int node_size) {
  return algorithm_step_count(d.op, d.algo, n, node_size);  // one schedule for the backend and the views
}

int algorithm_slices(const CollDesc& d, int n) {
  if (d.op != CollectiveOp::AllReduce || d.algo != Algorithm::Ring || n == 1) return 1;
  // Slices of about 256 KiB: small enough to be read back from cache by the successor, large
  // enough that the hand-off costs little next to the reduction.
  const int64_t chunk_bytes = (d.count / n + 1) * dtype_size(d.dtype);
  return static_cast<int>(std::clamp<int64_t>(chunk_bytes / (256 << 10), 1, 4096));
}

void run_collective(Call& c) {
  switch (c.rv->desc.dtype) {
    case DType::F32: return dispatch<float>(c);
    case DType::BF16: return dispatch<Bf16Bits>(c);
    case DType::F16: return dispatch<Fp16Bits>(c);
    default: return dispatch<int64_t>(c);
  }
}

}  // namespace dtlab::threads
