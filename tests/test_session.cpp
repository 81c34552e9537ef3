// The app's Session (app/session.h) without a window: a paused DDP run stepped by hand yields
// snapshots whose ring cells, buckets and inspector fields match what the engine did.
#ifdef DTLAB_HAVE_GUI
#include <doctest/doctest.h>

#include <chrono>

#include "app/session.h"

using namespace dtlab;
using namespace dtlab::app;

namespace {

TrainConfig lab_config(int world) {
  TrainConfig c;
  c.strategy = "ddp";
  c.world_size = world;
  c.model = ModelSpec::parse("mlp:2,64,64,3");
  c.batch = 16;
  c.steps = 50;
  c.ddp.bucket_cap_bytes = 4096;
  c.ddp.first_bucket_bytes = 1024;
  c.start_paused = true;
  c.timeout_s = 60;
  return c;
}

const Snapshot& step(Session& s, GateKind k, int times = 1) {
  for (int i = 0; i < times; i++) {
    REQUIRE(s.wait_settled(std::chrono::seconds(20)));
    s.step(k);
  }
  REQUIRE(s.wait_settled(std::chrono::seconds(20)));
  return s.update();
}

}  // namespace

TEST_SUITE("app") {
  TEST_CASE("a stepped ring all-reduce: cells hold s + 2 contributions after reduce-scatter step s") {
    Session s(lab_config(4));
    const Snapshot& a = step(s, GateKind::Collective, 2);  // at the gate of #2, bucket 0's all-reduce
    REQUIRE(a.collective.valid);
    CHECK(a.collective.seq == 2);
    CHECK(a.collective.op == CollectiveOp::AllReduce);
    CHECK(a.collective.steps == 6);
    CHECK(a.collective.steps_done == 0);
    CHECK(a.collective.pending.size() == 4);
    CHECK(a.collective.phase == RingPhase::ReduceScatter);
    CHECK(a.collective.predicted_s > 0);
    CHECK(a.collective.busbw_gbs == doctest::Approx(a.collective.algbw_gbs * 1.5));  // 2(n-1)/n
    const Snapshot& b = step(s, GateKind::RingStep, 3);  // start, then ring steps 0 and 1
    CHECK(b.collective.steps_done == 2);
    CHECK(b.collective.label.rfind("DDP bucket 0: ", 0) == 0);
    for (int r = 0; r < 4; r++) {
      // Step 1 of the reduce-scatter left chunk (r - 3) mod 4 with 3 contributions on rank r;
      // step 0 left chunk (r - 2) mod 4 with 2.
      CHECK(b.collective.cells[static_cast<size_t>(r)][static_cast<size_t>((r + 1) % 4)] == 3);
      CHECK(b.collective.cells[static_cast<size_t>(r)][static_cast<size_t>((r + 2) % 4)] == 2);
      CHECK(b.collective.cells[static_cast<size_t>(r)][static_cast<size_t>(r)] == 1);
    }
    // The buckets: bucket 0 is all-reducing, bucket 1 still waits its turn.
    REQUIRE(b.buckets.size() == 2);
    CHECK(b.buckets[0].state == BucketState::AllReducing);
    CHECK(b.buckets[0].launch_order == 0);
    CHECK(b.memory.size() == 4);
    CHECK(b.memory[3].stats.current_of(MemCategory::CommBuffers) == 4547 * 4);
  }

  TEST_CASE("iterations: history, data ownership and a clean reset") {
    Session s(lab_config(2));
    const Snapshot& a = step(s, GateKind::Iteration, 3);
    CHECK(a.history.size() >= 2);
    CHECK(a.data.valid);
    CHECK(a.data.n == 3000);
    int owned[2] = {0, 0};
    for (int16_t o : a.data.owner) {
      REQUIRE(o >= 0);
      owned[o]++;
    }
    CHECK(owned[0] == 1500);
    CHECK(owned[1] == 1500);
    bool saw_backward = false;
    for (const Event& e : a.events[1])
      if (e.kind == EventKind::Compute && e.compute.kind == ComputeKind::LayerBackward) saw_backward = true;
    CHECK(saw_backward);
    TrainConfig c = lab_config(3);
    s.restart(c);
    const Snapshot& b = s.update();
    CHECK(b.history.empty());
    CHECK(b.memory.size() == 3);
    CHECK_THROWS_AS(s.restart([] { TrainConfig bad = lab_config(2); bad.batch = 0; return bad; }()), Error);
    CHECK(s.config().world_size == 3);  // a rejected configuration keeps the run
  }
}
#endif  // DTLAB_HAVE_GUI
