// algorithm_step_plan (engine/comm/plan.h) against what the threads backend really did: every
// RingStep event a rank recorded as a receiver must be the plan's transfer into that rank.
#include <doctest/doctest.h>

#include <vector>

#include "engine/comm/plan.h"
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

}  // namespace

TEST_SUITE("comm") {
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
}
