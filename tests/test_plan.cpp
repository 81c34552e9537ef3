// algorithm_step_plan (engine/comm/plan.h) against what the threads backend really did: every
// RingStep event a rank recorded as a receiver must be the plan's transfer into that rank. And the
// ring's chunk order (engine/comm/ring_order.h) against the plans, the threads ring and the process
// groups' ring, so none of the four can drift from the others.
#include <doctest/doctest.h>

#include <memory>
#include <mutex>
#include <vector>

#include "engine/comm/data_mover.h"
#include "engine/comm/group.h"
#include "engine/comm/plan.h"
#include "engine/comm/ring_order.h"
#include "engine/comm/threads_backend.h"

using namespace dtlab;

namespace {

struct Case {
  CollectiveOp op;
  Algorithm algo;
  int root;
};

void run_op(Communicator& comm, const Case& c, int n) {
  const int64_t count = 6 * n;
  std::vector<float> buf(static_cast<size_t>(count * n), 1.0f), in(static_cast<size_t>(count * n), 1.0f);
  switch (c.op) {
    case CollectiveOp::AllReduce: comm.all_reduce(buf.data(), count, ReduceOp::Sum, c.algo)->wait(); break;
    case CollectiveOp::ReduceScatter: comm.reduce_scatter(buf.data(), in.data(), count, DType::F32, ReduceOp::Sum, c.algo)->wait(); break;
    case CollectiveOp::AllGather: comm.all_gather(buf.data(), in.data(), count, DType::F32, c.algo)->wait(); break;
    case CollectiveOp::Broadcast: comm.broadcast(buf.data(), count, DType::F32, c.root, c.algo)->wait(); break;
    case CollectiveOp::Reduce: comm.reduce(buf.data(), count, DType::F32, ReduceOp::Sum, c.root, c.algo)->wait(); break;
    case CollectiveOp::AllToAll: comm.all_to_all(buf.data(), in.data(), count, DType::F32)->wait(); break;
    default: break;
  }
}

// The RingStep events rank r recorded for a ring collective of `steps` steps: from its predecessor,
// chunk chunk_at(s) in step s, `bytes(chunk)` bytes, reduce-scatter then all-gather phases.
template <class ChunkAt, class Bytes>
void check_ring_events(ThreadsWorld& w, int r, int n, int steps, RingPhase first, ChunkAt chunk_at, Bytes bytes) {
  int seen = 0;
  for (const Event& e : w.recorder().events(r)) {
    if (e.kind != EventKind::RingStep) continue;
    CAPTURE(r);
    CAPTURE(e.step.step);
    CHECK(e.step.step == seen);
    CHECK(e.step.steps == steps);
    CHECK(e.step.src == ring_pred(r, n));
    CHECK(e.step.dst == r);
    CHECK(e.step.chunk == chunk_at(e.step.step));
    CHECK(e.step.bytes == bytes(e.step.chunk));
    CHECK(e.step.phase == (first == RingPhase::ReduceScatter && e.step.step < n - 1 ? RingPhase::ReduceScatter
                                                                                    : RingPhase::AllGather));
    seen++;
  }
  CHECK(seen == steps);
}

// A DataMover that keeps every fused ring step (reduce_copy) it is given and does it with the host's
// loops: the calls the cuda backend's one kernel receives, with the same arguments, on the CPU. One
// call per step, as on a device (no cache-sized slices).
class StepSpy : public DataMover {
 public:
  struct Call {
    int rank;
    const void *dst, *src;
    int64_t count;
    bool reduce;
    int finish_n;
  };
  std::mutex mu;
  std::vector<Call> calls;
  std::shared_ptr<DataMover> host = host_mover();
  const char* device_name() const override { return "spy"; }
  bool slice_ring_steps() const override { return false; }
  void copy(int r, void* d, const void* s, int64_t b) override { host->copy(r, d, s, b); }
  void reduce_into(int r, void* d, const void* s, int64_t n, DType dt, ReduceOp op) override { host->reduce_into(r, d, s, n, dt, op); }
  void reduce_to(int r, void* d, const void* a, const void* b, int64_t n, DType dt, ReduceOp op) override {
    host->reduce_to(r, d, a, b, n, dt, op);
  }
  void finish_avg(int r, void* b, int64_t n, DType dt, ReduceOp op, int w) override { host->finish_avg(r, b, n, dt, op, w); }
  std::unique_ptr<CommScratch> scratch(int r, int64_t b, MemoryTracker* t) override { return host->scratch(r, b, t); }
  void reduce_copy(int r, void* d, const void* s, int64_t n, DType dt, ReduceOp op, bool reduce, int finish_n) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      calls.push_back({r, d, s, n, reduce, finish_n});
    }
    DataMover::reduce_copy(r, d, s, n, dt, op, reduce, finish_n);
  }
};

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("the fused ring step (one reduce-copy a step, as the cuda kernel runs it) is the CPU ring's plan, step for step") {
    for (int n = 2; n <= 6; n++) {
      CAPTURE(n);
      const int64_t count = 7 * n + 3;  // uneven chunks
      // The plan's ring all-reduce is ring_allreduce_step's transfers, and Avg divides where the chunk is final.
      for (int s = 0; s < 2 * (n - 1); s++)
        for (int r = 0; r < n; r++) {
          const RingStepWork w = ring_allreduce_step(r, s, n);
          const std::vector<StepTransfer> plan = algorithm_step_plan(CollectiveOp::AllReduce, Algorithm::Ring, n, 0, s);
          REQUIRE(plan.size() == static_cast<size_t>(n));
          const StepTransfer& t = plan[static_cast<size_t>(r)];
          CHECK(t.dst == r);
          CHECK((w.transfer.src == t.src && w.transfer.chunk == t.chunk && w.transfer.phase == t.phase && w.transfer.reduce == t.reduce));
          CHECK(w.finishes == (s == n - 2));
        }
      // What the threads ring hands its mover: per rank and step, the plan's chunk of the predecessor's
      // buffer into the same chunk of its own, reduced or copied, with Avg's division on the final step.
      auto spy = std::make_shared<StepSpy>();
      WorldOptions o;
      o.mover = spy;
      ThreadsWorld world(n, o);
      std::vector<std::vector<float>> bufs(static_cast<size_t>(n));
      for (int r = 0; r < n; r++)
        for (int64_t i = 0; i < count; i++) bufs[size_t(r)].push_back(static_cast<float>(r + 1) * 0.25f + static_cast<float>(i));
      world.run([&](int r, Communicator& comm, RankContext&) {
        comm.all_reduce(bufs[size_t(r)].data(), count, DType::F32, ReduceOp::Avg, Algorithm::Ring)->wait();
      });
      std::vector<int> step(static_cast<size_t>(n), 0);
      REQUIRE(spy->calls.size() == static_cast<size_t>(n * 2 * (n - 1)));
      for (const StepSpy::Call& c : spy->calls) {  // each rank's calls in its own order
        const int s = step[size_t(c.rank)]++;
        const RingStepWork w = ring_allreduce_step(c.rank, s, n);
        const auto [lo, hi] = transfer_elements(w.transfer, count);
        CHECK(c.dst == bufs[size_t(c.rank)].data() + lo);
        CHECK(c.src == bufs[size_t(w.transfer.src)].data() + lo);
        CHECK(c.count == hi - lo);
        CHECK(c.reduce == w.transfer.reduce);
        CHECK(c.finish_n == (w.finishes ? n : 0));
      }
      // And the average it computes is the average.
      for (int r = 0; r < n; r++)
        for (int64_t i = 0; i < count; i += 5)
          CHECK(bufs[size_t(r)][size_t(i)] == doctest::Approx(0.25 * (n + 1) / 2.0 + static_cast<double>(i)));
    }
  }


  TEST_CASE("the step plan is the schedule the threads backend runs") {
    const std::vector<Case> cases = {
        {CollectiveOp::AllReduce, Algorithm::Ring, 0},    {CollectiveOp::AllReduce, Algorithm::Tree, 0},
        {CollectiveOp::AllReduce, Algorithm::Naive, 0},   {CollectiveOp::ReduceScatter, Algorithm::Ring, 0},
        {CollectiveOp::AllGather, Algorithm::Ring, 0},    {CollectiveOp::Broadcast, Algorithm::Tree, 2},
        {CollectiveOp::Broadcast, Algorithm::Naive, 1},   {CollectiveOp::Reduce, Algorithm::Tree, 1},
        {CollectiveOp::Reduce, Algorithm::Naive, 2},      {CollectiveOp::AllToAll, Algorithm::Naive, 0},
    };
    for (int n = 2; n <= 5; n++) {
      for (const Case& c : cases) {
        if (c.root >= n) continue;
        CAPTURE(n);
        CAPTURE(collective_name(c.op));
        CAPTURE(algorithm_name(c.algo));
        ThreadsWorld w(n);
        w.run([&](int, Communicator& comm, RankContext&) { run_op(comm, c, n); });
        const int steps = algorithm_step_count(c.op, c.algo, n);
        int matched = 0;
        for (int r = 0; r < n; r++) {
          for (const Event& e : w.recorder().events(r)) {
            if (e.kind != EventKind::RingStep) continue;
            CHECK(e.step.steps == steps);
            std::vector<StepTransfer> plan = algorithm_step_plan(c.op, c.algo, n, c.root, e.step.step);
            REQUIRE_FALSE(plan.empty());
            const StepTransfer* into = nullptr;
            for (const StepTransfer& t : plan)
              if (t.dst == r) into = &t;
            if (e.step.bytes == 0 || e.step.dst != r) {
              CHECK(into == nullptr);  // this rank received nothing in this step
              continue;
            }
            REQUIRE(into != nullptr);
            CHECK(into->src == e.step.src);
            CHECK(into->phase == e.step.phase);
            if (into->chunk >= 0) CHECK(into->chunk == e.step.chunk);
            matched++;
          }
        }
        int planned = 0;
        for (int s = 0; s < steps; s++) planned += static_cast<int>(algorithm_step_plan(c.op, c.algo, n, c.root, s).size());
        CHECK(matched == planned);  // every planned transfer happened
      }
    }
  }

  TEST_CASE("one ring chunk order: ring_order.h, the plans, the threads ring and the process groups agree") {
    for (int n = 2; n <= 5; n++) {
      CAPTURE(n);
      const int64_t count = 5 * n + 1;  // never a multiple of n: even chunks differ by one element
      const int64_t esize = static_cast<int64_t>(sizeof(float));
      auto even_bytes = [&](int k) { return (chunk_begin(count, n, k + 1) - chunk_begin(count, n, k)) * esize; };

      // The plans: every rank takes the header's chunk from its predecessor, which is the chunk the
      // predecessor sends; after the reduce-scatter chunk r is final on rank r.
      for (int s = 0; s < 2 * (n - 1); s++) {
        const std::vector<StepTransfer> ar = algorithm_step_plan(CollectiveOp::AllReduce, Algorithm::Ring, n, 0, s);
        REQUIRE(ar.size() == static_cast<size_t>(n));
        for (const StepTransfer& t : ar) {
          CHECK(t.src == ring_pred(t.dst, n));
          CHECK(t.chunk == ring_allreduce_recv_chunk(t.dst, s, n));
          CHECK(t.chunks == n);
          const auto [lo, hi] = transfer_elements(t, count);
          CHECK(lo == chunk_begin(count, n, t.chunk));
          CHECK((hi - lo) * esize == even_bytes(t.chunk));
        }
        if (s >= n - 1) continue;
        const std::vector<StepTransfer> rs = algorithm_step_plan(CollectiveOp::ReduceScatter, Algorithm::Ring, n, 0, s);
        const std::vector<StepTransfer> ag = algorithm_step_plan(CollectiveOp::AllGather, Algorithm::Ring, n, 0, s);
        REQUIRE(rs.size() == static_cast<size_t>(n));
        REQUIRE(ag.size() == static_cast<size_t>(n));
        for (const StepTransfer& t : rs) {
          CHECK(t.chunk == ring_rs_recv_chunk(t.dst, s, n));
          CHECK(t.chunk == ring_rs_send_chunk(t.src, s, n));
        }
        for (const StepTransfer& t : ag) {
          CHECK(t.chunk == ring_ag_recv_chunk(t.dst, s, n));
          CHECK(t.chunk == ring_ag_send_chunk(t.src, s, n));
        }
      }
      for (int r = 0; r < n; r++) CHECK(ring_rs_recv_chunk(r, n - 2, n) == r);

      // The threads backend's ring all-reduce (even chunks), reduce-scatter and all-gather (blocks).
      ThreadsWorld w(n);
      w.run([&](int, Communicator& comm, RankContext&) {
        std::vector<float> buf(static_cast<size_t>(count), 1.0f);
        comm.all_reduce(buf.data(), count, ReduceOp::Sum, Algorithm::Ring)->wait();
      });
      for (int r = 0; r < n; r++)
        check_ring_events(w, r, n, 2 * (n - 1), RingPhase::ReduceScatter,
                          [&](int s) { return ring_allreduce_recv_chunk(r, s, n); }, even_bytes);
      for (CollectiveOp op : {CollectiveOp::ReduceScatter, CollectiveOp::AllGather}) {
        CAPTURE(collective_name(op));
        ThreadsWorld b(n);
        b.run([&](int, Communicator& comm, RankContext&) { run_op(comm, {op, Algorithm::Ring, 0}, n); });
        const bool rs = op == CollectiveOp::ReduceScatter;
        for (int r = 0; r < n; r++)
          check_ring_events(b, r, n, n - 1, rs ? RingPhase::ReduceScatter : RingPhase::AllGather,
                            [&](int s) { return rs ? ring_rs_recv_chunk(r, s, n) : ring_ag_recv_chunk(r, s, n); },
                            [&](int) { return 6 * n * esize; });  // run_op's blocks of 6 n elements
      }

      // A process group over the whole world: the same order on padded chunks.
      ThreadsWorld g(n);
      g.run([&](int, Communicator& comm, RankContext&) {
        std::vector<int> ranks;
        for (int r = 0; r < n; r++) ranks.push_back(r);
        auto group = new_group(comm, ranks, 5, std::make_shared<GroupExecutor>());
        std::vector<float> buf(static_cast<size_t>(count), 1.0f);
        group->all_reduce(buf.data(), count)->wait();
        for (float x : buf) CHECK(x == static_cast<float>(n));
      });
      for (int r = 0; r < n; r++)
        check_ring_events(g, r, n, 2 * (n - 1), RingPhase::ReduceScatter,
                          [&](int s) { return ring_allreduce_recv_chunk(r, s, n); },
                          [&](int) { return padded_chunk(count, n) * esize; });
    }
  }
}
