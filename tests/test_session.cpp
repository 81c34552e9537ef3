// The app's Session (app/session.h) without a window: a paused DDP run stepped by hand yields
// snapshots whose ring cells, buckets and inspector fields match what the engine did; a pipeline run
// stepped by iteration and by time step yields a Snapshot::pipeline that matches the runtime's.
#ifdef DTLAB_HAVE_GUI
#include <doctest/doctest.h>

#include <chrono>

#include "app/alltoall_tracker.h"  // pick_alltoall
#include "app/options.h"
#include "app/session.h"
#include "tests/hostless.h"
#include "tests/session_util.h"
#include "tests/test_util.h"

using namespace dtlab;
using namespace dtlab::app;
using namespace dtlab::test;

namespace {

// p ranks, m micro-batches, every action 1 ms of modeled time, free links: the formulas hold exactly.
TrainConfig pipe_config(ScheduleKind kind, int p, int m, int v = 1) {
  TrainConfig c;
  c.strategy = Strategy::Pipeline;
  c.pipeline.stages = p;
  c.pipeline.microbatches = m;
  c.pipeline.schedule = kind;
  c.pipeline.chunks = v;
  c.pipeline.fixed_costs = ActionCosts{kUnitActionCost, kUnitActionCost, kUnitActionCost, kUnitActionCost, 0};
  c.world_size = p;
  c.model = ModelSpec::parse("mlp:2,16,16,16,16,16,16,16,3");  // 8 Linear layers
  c.batch = 16;
  c.steps = 20;
  c.profile = "ideal";
  c.start_paused = true;
  c.timeout_s = 60;
  return c;
}

// The row's actions in order, idle slots dropped.
std::vector<Action> row_actions(const PipelineSchedule& s, int rank) {
  std::vector<Action> out;
  for (const auto& a : s.order[static_cast<size_t>(rank)])
    if (a) out.push_back(*a);
  return out;
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
    // Iteration 1 has torch's one bucket (find_unused_parameters=False), all-reducing now.
    REQUIRE(b.buckets.size() == 1);
    CHECK(b.buckets[0].state == BucketState::AllReducing);
    CHECK(b.buckets[0].launch_order == 0);
    CHECK(b.memory.size() == 4);
    CHECK(b.memory[3].stats.current_of(MemCategory::CommBuffers) == 4547 * 4);
  }

  TEST_CASE("a paused GPT run whose ranks the host cannot read (a GPU's) shows the CPU's attention and text, in 16 bits too") {
    if (!test::kHostlessFaults) return;  // tests/hostless.h
    for (const Precision p : {Precision::FP32, Precision::BF16}) {
      CAPTURE(static_cast<int>(p));
      TrainConfig c = lab_config(2);
      c.model = ModelSpec::parse("gpt:layers=1,heads=2,embd=16,ctx=16");
      c.data = "text";
      c.precision = p;
      std::vector<float> want, got;
      std::string want_text, got_text, want_gen, got_gen;
      {
        Session s(c);
        step(s, GateKind::Iteration, 2);
        REQUIRE(s.attention(0, 1, want, want_text));
        want_gen = s.generate("Shall I", 30);
      }
      {
        test::HostlessWorlds hostless;
        Session s(c);
        step(s, GateKind::Iteration, 2);
        REQUIRE(s.attention(0, 1, got, got_text));
        got_gen = s.generate("Shall I", 30);
      }
      CHECK(got == want);
      CHECK(got_text == want_text);
      CHECK(got_gen == want_gen);
    }
  }

  TEST_CASE("a paused GPT run writes text from its current weights, and says why when it cannot") {
    TrainConfig c = lab_config(2);
    c.model = ModelSpec::parse("gpt:layers=1,heads=2,embd=16,ctx=16");
    c.data = "text";
    Session s(c);
    step(s, GateKind::Iteration, 2);
    const std::string text = s.generate("Shall I", 40);
    CHECK(text.size() == 40);  // the sonnets are ASCII: one byte per sampled character
    CHECK(s.generate("Shall I", 40) == text);  // seed 1337, the same weights while paused
    // The attention the last forward left: causal rows of probabilities over the first sample's text.
    std::vector<float> att;
    std::string sample;
    REQUIRE(s.attention(0, 1, att, sample));
    REQUIRE(att.size() == 16 * 16);
    CHECK(sample.size() == 16);
    for (int r = 0; r < 16; r++) {
      double row = 0;
      for (int k = 0; k < 16; k++) {
        if (k > r) CHECK(att[static_cast<size_t>(r * 16 + k)] == 0.0f);
        row += att[static_cast<size_t>(r * 16 + k)];
      }
      CHECK(row == doctest::Approx(1.0).epsilon(1e-5));
    }
    CHECK_FALSE(s.attention(1, 0, att, sample));  // one block: there is no block 1
    const std::string bad = test::error_sentence([&] { s.generate("\xce\xbb", 5); });
    CHECK(bad.rfind("the prompt holds a character the text does not; use characters of text:", 0) == 0);
    CHECK(bad.ends_with("data/shakespeare_sonnets.txt"));
    s.run();
    CHECK(test::error_sentence([&] { s.generate("Shall I", 5); }) == "the run is moving; pause it (or let it finish) and generate again");
    TrainConfig f = c;
    f.strategy = Strategy::Fsdp;
    s.restart(f);
    step(s, GateKind::Iteration, 1);
    CHECK(test::error_sentence([&] { s.generate("Shall I", 5); }) ==
          "FSDP shards rank 0's parameters, so no rank holds the whole model until the run ends; generate after the last step");
    TrainConfig p = c;  // a GPT pipeline of two stages, a block each
    p.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=16");
    p.strategy = Strategy::Pipeline;
    p.pipeline.stages = 2;
    p.pipeline.microbatches = 2;
    s.restart(p);
    step(s, GateKind::Iteration, 1);
    CHECK(test::error_sentence([&] { s.generate("Shall I", 5); }) ==
          "the pipeline's stages hold the model across ranks, gathered to rank 0 only when the run ends; generate after the last step");
    Session mlp(lab_config(2));
    CHECK(test::error_sentence([&] { mlp.generate("a", 5); }) == "generate samples text from a GPT; start a run with --model gpt-tiny");
    // Under --tp 2 head 1 is TP rank 1's: the grid reads it there, and generate puts the shards
    // together; both as the one-rank model's at the same step.
    TrainConfig one = c;
    one.strategy = Strategy::Single;
    one.world_size = 1;
    TrainConfig t = c;
    t.tp = 2;
    Session a(one), b(t);
    step(a, GateKind::Iteration, 2);
    step(b, GateKind::Iteration, 2);
    std::vector<float> want, got;
    REQUIRE(a.attention(0, 1, want, sample));
    REQUIRE(b.attention(0, 1, got, sample));
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); i++) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
    CHECK(b.generate("Shall I", 40).size() == 40);
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

  TEST_CASE("pipeline snapshot: GPipe p=4 m=8 after one iteration, as the runtime ran it") {
    Session s(pipe_config(ScheduleKind::GPipe, 4, 8));
    const Snapshot& a = step(s, GateKind::Iteration);  // iteration 0 ran; at iteration 1's gate
    const PipelineView& pv = a.pipeline;
    REQUIRE(pv.valid);
    CHECK(pv.iteration == 0);
    CHECK(pv.complete);
    CHECK(pv.bubble_iteration == 0);
    const PipelineSchedule plan = make_schedule(ScheduleKind::GPipe, 4, 8);
    CHECK(pv.plan.order == plan.order);
    CHECK(pv.plan.name == "GPipe");
    REQUIRE(pv.ranks.size() == 4);
    const double formula = formula_bubble(ScheduleKind::GPipe, 4, 8).of_wall;  // 3/11
    CHECK(pv.formula.of_wall == doctest::Approx(formula));
    for (int r = 0; r < 4; r++) {
      CAPTURE(r);
      const PipelineRankView& rv = pv.ranks[static_cast<size_t>(r)];
      REQUIRE(rv.done.size() == 16);
      // PyTorch's ScheduleGPipe order: every forward in micro-batch order, then every backward.
      std::vector<Action> ran;
      for (const PipelineActionView& x : rv.done) ran.push_back(x.action);
      CHECK(ran == row_actions(plan, r));
      for (int k = 0; k < 8; k++) {
        CHECK(action_str(rv.done[static_cast<size_t>(k)].action) == std::to_string(r) + "F" + std::to_string(k));
        CHECK(action_str(rv.done[static_cast<size_t>(8 + k)].action) == std::to_string(r) + "B" + std::to_string(k));
      }
      CHECK(rv.done[3].model_end - rv.done[3].model_begin == doctest::Approx(1e-3));
      CHECK(rv.done[0].bytes == (r < 3 ? 2 * 16 * 4 : 0));  // 2 rows of 16 floats sent on, none from the last stage
      // The view measures the bubble from the events exactly as the runtime does from its records.
      REQUIRE(rv.reported_bubble >= 0);
      CHECK(rv.bubble == rv.reported_bubble);
      CHECK(rv.bubble == doctest::Approx(formula).epsilon(1e-9));
      CHECK(rv.peak_inflight == 8);
      CHECK(pv.formula_peak[static_cast<size_t>(r)] == 8);
      CHECK_FALSE(rv.at_gate);
    }
    CHECK(pv.costs_measured);
    CHECK(pv.model_costs.forward == doctest::Approx(1e-3));
  }

  TEST_CASE("stepping a pipeline one time step at a time follows the planned grid") {
    Session s(pipe_config(ScheduleKind::OneFOneB, 4, 4));
    const PipelineSchedule plan = make_schedule(ScheduleKind::OneFOneB, 4, 4);
    const int steps = num_steps(plan);  // 14, as docs/strategies.md prints it
    REQUIRE(steps == 14);
    const Snapshot& a = step(s, GateKind::Action);  // past iteration 0's gate, to the first action gates
    for (const PipelineRankView& rv : a.pipeline.ranks) {
      CHECK(rv.at_gate);
      CHECK(rv.done.empty());
    }
    // Forwards only so far: the plan's backwards are drawn at the fixed 1 ms, not a placeholder.
    const Snapshot& warm = step(s, GateKind::Action);
    CHECK(warm.pipeline.costs_measured);
    CHECK(warm.pipeline.model_costs.backward == doctest::Approx(1e-3));
    for (int t = 1; t < steps; t++) {
      CAPTURE(t);
      const Snapshot& b = step(s, GateKind::Action);
      CHECK(b.pipeline.iteration == 0);
      for (int r = 0; r < 4; r++) {
        int planned = 0;
        for (int u = 0; u <= t; u++) planned += plan.order[static_cast<size_t>(r)].size() > static_cast<size_t>(u) &&
                                                plan.order[static_cast<size_t>(r)][static_cast<size_t>(u)].has_value();
        CHECK(static_cast<int>(b.pipeline.ranks[static_cast<size_t>(r)].done.size()) == planned);
        for (const PipelineActionView& x : b.pipeline.ranks[static_cast<size_t>(r)].done) CHECK(x.step <= t);
      }
    }
    CHECK(s.snapshot().pipeline.complete);
    // Iteration gates still work: the next iteration runs whole.
    const Snapshot& c = step(s, GateKind::Iteration, 2);
    CHECK(c.pipeline.iteration == 1);
    CHECK(c.pipeline.complete);
    // A restart while ranks wait at action gates ends the run cleanly and starts the new schedule.
    step(s, GateKind::Action, 3);
    s.restart(pipe_config(ScheduleKind::ZBH1, 2, 4));
    const Snapshot& d = step(s, GateKind::Iteration);
    CHECK(d.pipeline.plan.name == "ZB-H1");
    CHECK(d.pipeline.ranks.size() == 2);
    CHECK(d.pipeline.complete);
  }

  // Stepping the warm-up of a run with measured costs: the backwards not run yet are drawn at twice
  // the measured forward (docs/course_sources.md §14), so the chart's axis stays at the run's scale.
  TEST_CASE("a pipeline's unrun backwards are drawn at twice its measured forwards") {
    TrainConfig c = pipe_config(ScheduleKind::OneFOneB, 4, 4);
    c.pipeline.fixed_costs.reset();
    c.profile = "nvlink8";
    Session s(c);
    step(s, GateKind::Action);
    const Snapshot& warm = step(s, GateKind::Action, 2);
    REQUIRE(warm.pipeline.costs_measured);
    const ActionCosts& k = warm.pipeline.model_costs;
    CHECK(k.forward > 0);
    CHECK(k.forward < 1e-3);  // nanoseconds to microseconds of modeled compute, not the 1 s placeholder
    CHECK(k.backward == doctest::Approx(2 * k.forward));
    CHECK(k.backward_input == doctest::Approx(k.forward));
  }

  TEST_CASE("the lab fits a pipeline to its settings: world, batch, model depth") {
    TrainConfig c;
    c.batch = 64;
    c.model = ModelSpec::parse("mlp:2,256,256,3");
    c.pipeline.stages = 4;
    c.pipeline.microbatches = 6;
    c.pipeline.chunks = 2;
    c.pipeline.dp = 2;
    c.pipeline.split = {1, 2};
    fit_pipeline(c);
    CHECK(c.world_size == 8);
    CHECK(c.batch == 66);  // the nearest multiple of 6
    CHECK(c.model.str() == "mlp:2,256,256,256,256,256,256,256,3");  // 8 Linear layers for 4 x 2 stages
    CHECK(c.pipeline.split.empty());  // 2 counts cannot cut 8 stages
  }

  // Ulysses (--world 4 --cp 2): plain all-to-alls of equal blocks in cp0 and cp1. Each rank keeps one
  // block of two and sends the other; the view follows the group of the all-to-all the stepper holds.
  TEST_CASE("a Ulysses run's all-to-alls: each rank's own block kept, one block sent, the held group followed") {
    TrainConfig c = lab_config(4);
    c.model = ModelSpec::parse("gpt:layers=2,heads=4,embd=16,ctx=16");
    c.data = "text";
    c.cp = 2;
    c.cp_layout = CpLayout::Ulysses;
    c.batch = 2;
    Session session(c);
    const Snapshot* s = &step(session, GateKind::Collective);
    for (int i = 0; i < 30 && !(s->held.valid && s->held.gate.coll == CollectiveOp::AllToAll); i++) s = &step(session, GateKind::Collective);
    REQUIRE(s->held.gate.coll == CollectiveOp::AllToAll);
    const int32_t first = s->held.gate.trace_group;
    REQUIRE(s->alltoall.valid);
    CHECK(s->alltoall_held);
    CHECK(s->alltoall.group == first);
    CHECK_FALSE(s->alltoall.split_sizes);
    const int64_t block = s->held.gate.bytes / 2;  // the payload is both blocks
    REQUIRE(block > 0);
    for (int i = 0; i < 2; i++) {
      CAPTURE(i);
      CHECK(s->alltoall.at(i, i) == block);   // kept
      CHECK(s->alltoall.sent[static_cast<size_t>(i)] == block);  // the other block, not the whole buffer
    }
    // R enters it: held before its one round, nothing moved yet, the cells to move outlined.
    s = &step(session, GateKind::RingStep);
    REQUIRE(s->held.kind == GateKind::RingStep);
    CHECK(s->alltoall.group == s->held.gate.trace_group);
    CHECK(s->alltoall.in_flight);
    CHECK(s->alltoall.steps_done == 0);
    CHECK(s->alltoall.at(0, 1) == -1);
    // Stepping on reaches the other CP group's all-to-all: the view goes with it.
    for (int i = 0; i < 30 && !(s->held.valid && s->held.gate.coll == CollectiveOp::AllToAll && s->held.gate.trace_group != first); i++)
      s = &step(session, GateKind::Collective);
    REQUIRE(s->held.gate.trace_group != first);
    CHECK(s->alltoall_held);
    CHECK(s->alltoall.group == s->held.gate.trace_group);
    CHECK(s->alltoall_groups.size() == 2);
    CHECK(pick_alltoall(*s, first).group == s->held.gate.trace_group);  // a pick waits while a held one is shown
  }

  // Ring attention's passes: after an iteration each block's backward is its latest pass, and its
  // forward is still there for the Context view's block selector.
  TEST_CASE("the Context view keeps each block's forward pass beside its backward") {
    TrainConfig c = lab_config(4);
    c.model = ModelSpec::parse("gpt:layers=2,heads=4,embd=16,ctx=16");
    c.data = "text";
    c.cp = 2;
    c.batch = 2;
    Session session(c);
    const Snapshot& s = step(session, GateKind::Iteration, 2);  // the setup, then iteration 0
    REQUIRE(s.context.read);
    for (int r = 0; r < 4; r++) {
      const std::vector<int>* g = s.context.group_of(r);
      REQUIRE(g != nullptr);
      const int q = static_cast<int>(std::find(g->begin(), g->end(), r) - g->begin());  // its CP rank
      const ContextRankView& rv = s.context.ranks[static_cast<size_t>(r)];
      for (int l = 0; l < 2; l++) {
        CAPTURE(r);
        CAPTURE(l);
        const ContextPassView& f = rv.pass(l, false);
        const ContextPassView& b = rv.pass(l, true);
        REQUIRE(f.valid);
        REQUIRE(b.valid);
        CHECK_FALSE(f.backward);
        CHECK(b.backward);
        CHECK(b.steps_done == 2);
        // Forward: step s meets rank q - s's block; backward the other way round.
        CHECK(f.held[1] == (q + 1) % 2);
        CHECK(b.held[0] == q);
        CHECK(f.pairs[static_cast<size_t>(0)] == b.pairs[static_cast<size_t>(0)]);  // its own block, the same causal pairs
      }
    }
  }

  // A pipeline's ranks hold their stages' activations per micro-batch: the Context and Experts views
  // read the micro-batch each stage ran last, on every rank, and after the run the last ones.
  TEST_CASE("under a pipeline the Context and Experts views read each rank's stages, during and after the run") {
    TrainConfig c = lab_config(4);
    c.strategy = Strategy::Pipeline;
    c.pipeline.stages = 2;
    c.pipeline.microbatches = 2;
    c.model = ModelSpec::parse("gpt:layers=2,heads=4,embd=16,ctx=16");
    c.data = "text";
    c.eval_samples = 16;
    c.cp = 2;
    c.moe = MoeSpec::parse("experts=4,top_k=2");
    c.batch = 4;
    c.steps = 2;
    Session session(c);
    // `forwards`: the stage's MoE history holds every micro-batch's forward (its slots share it; it
    // held one slot's, every other forward).
    auto check_views = [](const Snapshot& s, size_t forwards) {
      REQUIRE(s.context.read);
      REQUIRE(s.experts.read);
      for (int r = 0; r < 4; r++) {
        CAPTURE(r);
        const int block = r % 2;  // rank = cp rank x 2 + stage rank: stage s holds block s
        const ContextRankView& rv = s.context.ranks[static_cast<size_t>(r)];
        CHECK(rv.positions.size() == 8);  // T / cp
        CHECK(rv.pass(block, false).valid);
        CHECK(rv.pass(block, true).valid);
        CHECK_FALSE(rv.pass(1 - block, false).valid);  // the other stage's block
        const auto& routed = s.experts.ranks[static_cast<size_t>(r)];
        REQUIRE(routed.size() == 1);
        CHECK(routed[0].layer == block);
        CHECK(routed[0].tokens == 2 * 8);  // a micro-batch of 2 samples, this CP rank's 8 positions each
        CHECK(routed[0].imbalance_history.size() == forwards);
        CHECK(routed[0].aux_history.size() == forwards);
      }
    };
    check_views(step(session, GateKind::Iteration, 2), 4);  // two iterations of 2 micro-batches
    session.run();
    REQUIRE(session.wait_settled(std::chrono::seconds(60)));
    REQUIRE(session.finished());
    check_views(session.update(), 4);
  }
}
#endif  // DTLAB_HAVE_GUI
