// The double binary tree, hierarchical and in-network all-reduces (issue 19) checked the nccl-tests
// way: every result against a serial reference (#wrong = 0; inputs are small integers, so float sums
// are exact and the order of the reduction cannot show), then what they record: the plan of
// engine/comm/plan.h equals the RingStep events, each transfer moves the bytes of its closed form,
// the step counts, NCCL's trees, and the sentences a topology that cannot run them gets.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "engine/comm/plan.h"
#include "engine/comm/reduce_kernels.h"  // ceil_log2
#include "engine/comm/socket_backend.h"
#include "engine/comm/socket_mesh.h"  // pick_free_port
#include "engine/comm/threads_backend.h"
#include "comm_util.h"
#include "test_util.h"

using namespace dtlab;
using namespace dtlab::test;

namespace {

constexpr int K = kPipelineChunks;
constexpr Algorithm kNew[] = {Algorithm::DoubleTree, Algorithm::Hierarchical, Algorithm::InNetwork};

// A made-up topology: nodes of `G` ranks (0: one node), with or without a switch that reduces.
HardwareProfile topology(int G, bool switch_reduces = true) {
  HardwareProfile p = find_profile("ib2x4");
  p.name = "test-" + std::to_string(G);
  p.gpus_per_node = G > 0 ? G : 64;
  p.switch_reduces = switch_reduces;
  return p;
}

WorldOptions options(const HardwareProfile& p, bool record = false) {
  WorldOptions o;
  o.timeout_s = 30;
  o.hardware = p;
  o.record = record;
  o.trace_capacity = record ? size_t{1} << 16 : 16;
  return o;
}

// The node sizes the hierarchical all-reduce is run with on n ranks: one node, and every G that
// cuts n into whole nodes of 1 to 4 ranks.
std::vector<int> node_sizes(int n) {
  std::vector<int> v = {0};
  for (int G = 1; G <= 4; G++)
    if (G < n && n % G == 0) v.push_back(G);
  return v;
}

// Values near 2^58: any trip through float or double would lose the low bits.
int64_t allreduce_wrong_i64(ThreadsWorld& w, int64_t count, ReduceOp op, Algorithm algo) {
  const int n = w.world_size();
  auto v = [](int rank, int64_t i) { return (int64_t(rank + 1) << 55) + 3 * i + 1; };
  std::vector<int64_t> bad(static_cast<size_t>(n), 0);
  w.run([&](int r, Communicator& c, RankContext&) {
    std::vector<int64_t> buf(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; i++) buf[size_t(i)] = v(r, i);
    c.all_reduce(buf.data(), count, DType::I64, op, algo)->wait();
    for (int64_t i = 0; i < count; i++) {
      int64_t e = op == ReduceOp::Max ? v(n - 1, i) : 0;
      for (int q = 0; op == ReduceOp::Sum && q < n; q++) e += v(q, i);
      bad[size_t(r)] += buf[size_t(i)] != e;
    }
  });
  return std::accumulate(bad.begin(), bad.end(), int64_t{0});
}

// The worlds and profiles each new algorithm runs on for n ranks.
std::vector<HardwareProfile> profiles_for(Algorithm algo, int n) {
  if (algo != Algorithm::Hierarchical) return {topology(0)};
  std::vector<HardwareProfile> v;
  for (int G : node_sizes(n)) v.push_back(topology(G));
  return v;
}

// Runs one float all-reduce of `count` elements, recording its events.
void run_recorded(ThreadsWorld& w, int64_t count, Algorithm algo) {
  w.run([&](int r, Communicator& c, RankContext&) {
    std::vector<float> buf(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; i++) buf[size_t(i)] = value(r, i);
    c.all_reduce(buf.data(), count, DType::F32, ReduceOp::Sum, algo)->wait();
  });
}

std::vector<Event> ring_steps(ThreadsWorld& w, int r) {
  std::vector<Event> out;
  for (const Event& e : w.recorder().events(r))
    if (e.kind == EventKind::RingStep) out.push_back(e);
  return out;
}

// The bytes a transfer of chunk k moves (chunks cut by chunk_begin: count (k+1)/D - count k/D elements).
int64_t chunk_bytes(int64_t count, int D, int k, int64_t esize = 4) {
  return (count * (k + 1) / D - count * k / D) * esize;
}

std::string label(Algorithm algo, int n, int G, int64_t count) {
  return std::string(algorithm_name(algo)) + " world " + std::to_string(n) + " node size " + std::to_string(G) +
         " count " + std::to_string(count);
}

}  // namespace

TEST_SUITE("comm") {

TEST_CASE("the double binary tree is NCCL's: in-order tree 0, tree 1 mirrored (even) or shifted (odd)") {
  // NCCL's illustrations (src/graph/trees.cc): 12 ranks, 0 -> 8 -> {4, 10}; mirrored, 11 -> 3 -> {7, 1}.
  CHECK(double_tree_links(12, 0, 0).child[0] == 8);
  CHECK((double_tree_links(12, 0, 8).child[0] == 4 && double_tree_links(12, 0, 8).child[1] == 10));
  CHECK(double_tree_links(12, 0, 8).parent == 0);
  CHECK(double_tree_links(12, 1, 3).parent == 11);
  CHECK((double_tree_links(12, 1, 3).child[0] == 7 && double_tree_links(12, 1, 3).child[1] == 1));
  // 13 ranks, tree 1 is tree 0 shifted by one: 1 -> 9 -> {5, 0}.
  CHECK(double_tree_links(13, 1, 9).parent == 1);
  CHECK((double_tree_links(13, 1, 9).child[0] == 5 && double_tree_links(13, 1, 9).child[1] == 0));
  CHECK(double_tree_links(14, 0, 12).child[1] == 13);  // the right child is the nearest that exists
  for (int n = 1; n <= 64; n++)
    for (int tree = 0; tree < 2; tree++) {
      CAPTURE(n);
      CAPTURE(tree);
      int roots = 0, edges = 0, max_depth = 0;
      for (int r = 0; r < n; r++) {
        const TreeLinks t = double_tree_links(n, tree, r);
        roots += t.parent < 0;
        if (t.parent < 0) CHECK(r == double_tree_root(n, tree));
        for (int ch : t.child)
          if (ch >= 0) {
            edges++;
            CHECK(double_tree_links(n, tree, ch).parent == r);
            CHECK(double_tree_links(n, tree, ch).depth == t.depth + 1);
          }
        max_depth = std::max(max_depth, t.depth);
      }
      CHECK(roots == 1);
      CHECK(edges == n - 1);  // one tree over every rank
      CHECK(double_tree_links(n, tree, double_tree_root(n, tree)).height == ceil_log2(n));
      CHECK(max_depth == ceil_log2(n));
    }
  // With an even world a rank forwards in one tree only: inner in one, a leaf in the other.
  for (int n = 2; n <= 64; n += 2)
    for (int r = 0; r < n; r++)
      CHECK_MESSAGE((double_tree_links(n, 0, r).height == 0 || double_tree_links(n, 1, r).height == 0),
                    "world " << n << " rank " << r);
}

TEST_CASE("step counts: dbtree 2(K+log2 n-1), hierarchical 2(G-1)+2(N-1), nvls K+1") {
  const CollectiveOp ar = CollectiveOp::AllReduce;
  for (int n = 1; n <= 16; n++) {
    CAPTURE(n);
    const int one = n == 1 ? 0 : 1;
    CHECK(algorithm_step_count(ar, Algorithm::DoubleTree, n) == one * 2 * (K + ceil_log2(n) - 1));
    CHECK(algorithm_step_count(ar, Algorithm::InNetwork, n) == one * (K + 1));
    CHECK(algorithm_step_count(ar, Algorithm::Hierarchical, n) == algorithm_step_count(ar, Algorithm::Ring, n));
    for (int G : node_sizes(n))
      if (G > 0) CHECK(algorithm_step_count(ar, Algorithm::Hierarchical, n, G) == one * (2 * (G - 1) + 2 * (n / G - 1)));
  }
  CHECK(algorithm_step_count(ar, Algorithm::Hierarchical, 6, 4) == 0);  // not whole nodes: refused at the call
  CHECK(algorithm_step_count(ar, Algorithm::DoubleTree, 8) == 12);
  CHECK(algorithm_step_count(ar, Algorithm::Hierarchical, 16, 8) == 16);
}

// Under the sanitizers (DTLAB_TEST_QUICK=1) the three suites below run a few worlds (odd, even, a
// power of two, more than 8) instead of all: they check the algorithms' arithmetic, which the Release
// run covers for every world, while the sanitizers look for races and bad memory, which the smaller
// worlds exercise the same way.
namespace {
std::vector<int> algorithm_worlds(std::vector<int> all, std::vector<int> quick_ones) { return quick() ? quick_ones : all; }
}  // namespace

TEST_CASE("dbtree, hierarchical and nvls all-reduce equal the serial reference: worlds 1-16, sum, avg, max") {
  const std::vector<int64_t> counts = {0, 1, 3, 7, 1000};
  for (int n : algorithm_worlds({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, {1, 2, 3, 5, 8, 9}))
    for (Algorithm algo : kNew)
      for (const HardwareProfile& p : profiles_for(algo, n)) {
        ThreadsWorld w(n, options(p));
        for (int64_t count : counts)
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max})
            CHECK_MESSAGE(allreduce_wrong(w, count, op, algo) == 0,
                          label(algo, n, p.gpus_per_node, count) << " " << reduce_op_name(op));
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max})
          CHECK_MESSAGE(allreduce_wrong_i64(w, n + 1001, op, algo) == 0,
                        "int64 " << label(algo, n, p.gpus_per_node, n + 1001) << " " << reduce_op_name(op));
      }
}

TEST_CASE("the new all-reduces on a large odd count (1000003 elements) equal the reference") {
  if (quick()) return;
  for (int n : {3, 8, 12})
    for (Algorithm algo : kNew) {
      const HardwareProfile p = topology(algo == Algorithm::Hierarchical ? (n % 4 == 0 ? 4 : 3) : 0);
      ThreadsWorld w(n, options(p));
      CHECK_MESSAGE(allreduce_wrong(w, 1000003, ReduceOp::Sum, algo) == 0, label(algo, n, p.gpus_per_node, 1000003));
      CHECK_MESSAGE(allreduce_wrong(w, 1000003, ReduceOp::Avg, algo) == 0, label(algo, n, p.gpus_per_node, 1000003));
    }
}

TEST_CASE("the step plan is what the new all-reduces record, step by step and transfer by transfer") {
  for (int n : algorithm_worlds({2, 3, 4, 5, 6, 7, 8, 9, 12, 16}, {2, 3, 8, 12}))
    for (Algorithm algo : kNew)
      for (const HardwareProfile& p : profiles_for(algo, n)) {
        const int G = p.gpus_per_node;
        const int64_t count = 1000 + n;
        INFO(label(algo, n, G, count));
        ThreadsWorld w(n, options(p, true));
        run_recorded(w, count, algo);
        const int steps = algorithm_step_count(CollectiveOp::AllReduce, algo, n, G);
        REQUIRE(steps > 0);
        std::map<std::tuple<int, int, int, int>, int> planned;  // (step, src, dst, chunk) -> times recorded
        for (int s = 0; s < steps; s++)
          for (const StepTransfer& t : algorithm_step_plan(CollectiveOp::AllReduce, algo, n, 0, s, G))
            planned[{s, t.src, t.dst, t.chunk}] = 0;
        for (int r = 0; r < n; r++) {
          std::vector<int> seen(static_cast<size_t>(steps), 0);
          for (const Event& e : ring_steps(w, r)) {
            const RingStepInfo& st = e.step;
            CHECK(st.steps == steps);
            REQUIRE((st.step >= 0 && st.step < steps));
            seen[size_t(st.step)]++;
            const std::vector<StepTransfer> plan = algorithm_step_plan(CollectiveOp::AllReduce, algo, n, 0, st.step, G);
            if (st.src == -1) {  // this rank takes no part in the step
              for (const StepTransfer& t : plan) CHECK((t.dst != r && !(t.src == r && t.dst == kNetworkSwitch)));
              continue;
            }
            CHECK((st.dst == r || (st.src == r && st.dst == kNetworkSwitch)));
            auto it = planned.find({st.step, st.src, st.dst, st.chunk});
            REQUIRE_MESSAGE(it != planned.end(), "step " << st.step << " " << st.src << " -> " << st.dst << " chunk " << st.chunk);
            it->second++;
            for (const StepTransfer& t : plan)
              if (t.src == st.src && t.dst == st.dst && t.chunk == st.chunk) CHECK(t.phase == st.phase);
          }
          for (int s = 0; s < steps; s++) CHECK_MESSAGE(seen[size_t(s)] >= 1, "rank " << r << " step " << s);
        }
        for (const auto& kv : planned) CHECK_MESSAGE(kv.second == 1, "step " << std::get<0>(kv.first));  // (clang 14: no lambda captures of bindings)
      }
}

TEST_CASE("bytes per transfer match the closed forms: dbtree S/2K, hierarchical S/G and S/GN, nvls S/K") {
  for (int n : algorithm_worlds({2, 3, 4, 7, 8, 12, 16}, {2, 3, 8, 12}))
    for (Algorithm algo : kNew)
      for (const HardwareProfile& p : profiles_for(algo, n)) {
        const int G = std::min(p.gpus_per_node, n), N = n / G;
        for (int64_t count : quick() ? std::vector<int64_t>{7, 4099} : std::vector<int64_t>{7, 1000, 4099}) {
          INFO(label(algo, n, G, count));
          ThreadsWorld w(n, options(p, true));
          run_recorded(w, count, algo);
          std::vector<int64_t> up(size_t(2 * n), 0), down(size_t(2 * n), 0), inter(size_t(n), 0);
          for (int r = 0; r < n; r++)
            for (const Event& e : ring_steps(w, r)) {
              const RingStepInfo& st = e.step;
              if (st.src == -1) {
                CHECK(st.bytes == 0);
                continue;
              }
              if (algo == Algorithm::DoubleTree) {
                CHECK(st.bytes == chunk_bytes(count, 2 * K, st.chunk));
                const int tree = st.chunk / K;
                if (st.phase == RingPhase::Reduce) up[size_t(tree * n + st.src)] += st.bytes;
                else down[size_t(tree * n + st.dst)] += st.bytes;
              } else if (algo == Algorithm::InNetwork) {
                CHECK(st.bytes == chunk_bytes(count, K, st.chunk));
                if (st.dst == kNetworkSwitch) up[size_t(st.src)] += st.bytes;
                else down[size_t(st.dst)] += st.bytes;
              } else if (st.src / G == st.dst / G) {  // inside a node: a shard of S/G
                CHECK(st.bytes == chunk_bytes(count, G, st.chunk));
                CHECK(st.chunk < G);
              } else {  // across nodes: a piece of S/(G N) of the rank's own shard
                CHECK(st.bytes == chunk_bytes(count, G * N, st.chunk));
                CHECK(st.chunk / N == r % G);
                inter[size_t(r)] += st.bytes;
              }
            }
          if (algo == Algorithm::DoubleTree) {
            // Every non-root rank of a tree sends its whole half up once and receives it down once.
            for (int tree = 0; tree < 2; tree++)
              for (int r = 0; r < n; r++) {
                const int64_t half = (tree == 0 ? count / 2 : count - count / 2) * 4;
                const bool root = r == double_tree_root(n, tree);
                CHECK(up[size_t(tree * n + r)] == (root ? 0 : half));
                CHECK(down[size_t(tree * n + r)] == (root ? 0 : half));
              }
          } else if (algo == Algorithm::InNetwork) {
            for (int r = 0; r < n; r++) CHECK((up[size_t(r)] == count * 4 && down[size_t(r)] == count * 4));
          } else {
            // Across nodes a rank moves 2(N-1)/N of its shard, S/G (to within a few elements).
            for (int r = 0; r < n; r++)
              CHECK(std::abs(double(inter[size_t(r)]) - 2.0 * (N - 1) / N * count * 4 / G) <= 2.0 * N * 4);
          }
        }
      }
}

TEST_CASE("a topology that cannot run the algorithm gets one sentence at the call, on every rank") {
  auto refusal = [](int n, const WorldOptions& o, Algorithm algo) {
    ThreadsWorld w(n, o);
    std::vector<std::string> msg(static_cast<size_t>(n));
    w.run([&](int r, Communicator& c, RankContext&) {
      std::vector<float> buf(8, 1.0f);
      try {
        c.all_reduce(buf.data(), 8, DType::F32, ReduceOp::Sum, algo);
      } catch (const Error& e) {
        msg[size_t(r)] = e.what();
      }
      c.all_reduce(buf.data(), 8, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();  // no sequence number used up
    });
    for (int r = 1; r < n; r++) CHECK(msg[size_t(r)] == msg[0]);
    return msg[0];
  };
  WorldOptions o;
  o.profile = "ib2x4";
  CHECK(refusal(6, o, Algorithm::Hierarchical) ==
        "hierarchical all-reduce needs whole nodes: world 6 is not a multiple of profile 'ib2x4''s 4 GPUs per node; "
        "use a world of 4, 8, ... or another algorithm");
  o.profile = "nvlink8";
  const std::string nvls = refusal(4, o, Algorithm::InNetwork);
  CHECK(nvls.find("in-network all-reduce (nvls) needs a switch that reduces (NVLink SHARP or InfiniBand SHARP) and "
                  "profile 'nvlink8' has none; ") == 0);
  CHECK(nvls.find("another algorithm") != std::string::npos);
  for (const HardwareProfile& p : builtin_profiles())  // the sentence names every profile that has one
    if (p.switch_reduces) CHECK(nvls.find(p.name) != std::string::npos);
  // A world that fits in one node runs hierarchical as the ring.
  CHECK(refusal(3, options(topology(4)), Algorithm::Hierarchical).empty());
}

TEST_CASE("the socket backend refuses the new all-reduces in one sentence naming the backends that run them") {
  SocketOptions o;
  o.rank = 0;
  o.world_size = 1;
  o.master_port = pick_free_port("127.0.0.1");
  SocketCommunicator c(o, nullptr);
  std::vector<float> buf(4, 1.0f);
  for (Algorithm algo : kNew) {
    std::string msg;
    try {
      c.all_reduce(buf.data(), 4, DType::F32, ReduceOp::Sum, algo);
    } catch (const Error& e) {
      msg = e.what();
    }
    CHECK(msg == std::string("the socket backend runs all-reduce as ring, tree or naive, not ") + algorithm_name(algo) +
                     "; dbtree, hierarchical and nvls run on the threads and cuda backends (--backend threads or cuda)");
  }
  c.all_reduce(buf.data(), 4, DType::F32, ReduceOp::Sum, Algorithm::Ring)->wait();
  CHECK(buf[0] == 1.0f);
}

TEST_CASE("nvls charges a switch transfer by the rank's own link, every step costs time") {
  const int n = 4;
  ThreadsWorld w(n, options(topology(0), true));
  run_recorded(w, 4096, Algorithm::InNetwork);
  for (const Event& e : ring_steps(w, 0)) CHECK((std::isfinite(e.model_end) && e.model_end > e.model_begin));
}

}  // TEST_SUITE
