// The live figures lesson 24 (mixed precision) reads: master-weight bytes, the training dtype's
// bytes, and fp16's loss scaler from the step history and each rank's LossScale events.
#ifdef DTLAB_HAVE_GUI
#include <doctest/doctest.h>

#include "app/figures.h"
#include "app/snapshot.h"
#include "engine/core/check.h"
#include "tests/figure_util.h"

using namespace dtlab;
using namespace dtlab::app;

namespace {

Event loss_scale_event(int32_t iteration, float scale, bool found, bool skipped) {
  Event e(EventKind::LossScale, Lane::Compute, 0, 0, 0, 0);
  e.iteration = iteration;
  e.scaler = LossScaleInfo{scale, skipped ? scale / 2 : scale, static_cast<uint8_t>(found), static_cast<uint8_t>(skipped), 0};
  return e;
}

}  // namespace

TEST_SUITE("lessons") {
  TEST_CASE("mixed-precision figures: master weights, the dtype's bytes, skipped steps and each rank's scaler") {
    Snapshot s;
    s.config.world = 2;
    const FigureScope sc{&s, nullptr};
    auto eval = [&](const char* t) { return Figure::parse(t).eval(sc); };
    CHECK(eval("run.precision_bytes") == 4);
    CHECK(test::figure_error("scaler.found_inf(0, 2)", s) == "scaler.found_inf(): this run has no loss scaler; train with --precision fp16");
    s.config.precision = Precision::BF16;
    CHECK(eval("run.precision_bytes") == 2);
    s.memory.resize(2);
    s.memory[1].stats.current[static_cast<size_t>(MemCategory::MasterWeights)] = 18188;
    CHECK(eval("memory.rank[1].master") == 18188);
    CHECK(eval("memory.rank[0].master") == 0);

    s.config.precision = Precision::FP16;
    CHECK(eval("count.skipped_steps") == 0);
    CHECK(eval("scaler.last_skipped_step") == -1);
    for (int64_t k = 1; k <= 5; k++) {
      StepPoint p;
      p.step = k;
      p.skipped = k == 2 || k == 4;
      p.loss_scale = k <= 2 ? 65536.0f : k <= 4 ? 32768.0f : 16384.0f;
      s.history.push_back(p);
      s.steps_reported++;  // as SnapshotBuilder::set_reports counts them (the history may be thinned)
      if (p.skipped) s.steps_skipped++, s.last_skipped_step = k;
    }
    CHECK(eval("count.skipped_steps") == 2);
    CHECK(eval("scaler.last_skipped_step") == 4);
    CHECK(eval("scaler.scale") == 16384);
    // Rank 1 overflowed in iteration 3; both ranks skipped it (the agreement).
    s.events.resize(2);
    s.events[0] = {loss_scale_event(2, 65536, false, false), loss_scale_event(3, 32768, false, true)};
    s.events[1] = {loss_scale_event(2, 65536, false, false), loss_scale_event(3, 32768, true, true)};
    CHECK(eval("scaler.found_inf(0, 3)") == 0);
    CHECK(eval("scaler.found_inf(1, 3)") == 1);
    CHECK(eval("scaler.skipped(0, 3) + scaler.skipped(1, 3)") == 2);
    CHECK(eval("scaler.skipped(0, 2)") == 0);
    CHECK(eval("scaler.next_scale(1, 3)") == 16384);
    CHECK(test::figure_error("scaler.skipped(0, 1)", s) ==
          "scaler.skipped(): rank 0 has no loss-scale decision for iteration 1 (not run yet, or older than the last few iterations)");
    CHECK(test::figure_error("scaler.skipped(2, 3)", s) == "scaler.skipped(): rank 2 does not exist (there are 2)");
  }
}
#endif  // DTLAB_HAVE_GUI
