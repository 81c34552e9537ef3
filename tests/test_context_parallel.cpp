// Context parallelism (--cp): the GPT's sequence split over a CP group equals the same GPT on one
// rank after 20 steps in every layout (ring, zigzag, Ulysses) and degree 2 and 4, alone, with data
// parallelism and with tensor parallelism; each ring send and all-to-all moves the bytes of its
// formula; the contiguous layout's causal work is 1, 2, ..., c blocks and zigzag's is equal; and the
// refusals name what to do instead.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "engine/core/gpt.h"
#include "engine/parallel/context_parallel.h"
#include "engine/train/train.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

namespace dtlab {

namespace {

// gpt (2 blocks, 4 heads, C 16, T 16) on the text data, AdamW, 20 steps of `batch` samples per CP group.
TrainConfig cp_config(int world, int cp, CpLayout layout, int64_t batch, int64_t steps = 20) {
  TrainConfig c = test::demo_config("ddp", world, batch, steps);
  c.model = ModelSpec::parse("gpt:layers=2,heads=4,embd=16,ctx=16");
  c.data = "text";
  c.eval_samples = 256;  // (the final evaluation: the whole text is 12k samples, most of a test run)
  c.cp = cp;
  c.cp_layout = layout;
  return c;
}

// The one-rank GPT of the same samples per step.
TrainConfig reference(const TrainConfig& c, int64_t batch) {
  TrainConfig r = test::single_like(c, batch);
  r.cp = 1;
  r.cp_layout = CpLayout::Ring;
  r.tp = 1;
  r.sequence_parallel = false;
  return r;
}

// Runs `c` paused, stepping by `kind` to its end, and hands `seen` each item iteration 1 stops at.
template <class Seen>
void step_through(TrainConfig c, GateKind kind, Seen seen) {
  using Clock = std::chrono::steady_clock;
  c.start_paused = true;
  c.timeout_s = 30;
  Trainer t(c);
  test::BackgroundRun runner(t);
  Stepper& st = t.stepper();
  const auto give_up = Clock::now() + std::chrono::seconds(120);
  while (!runner.done() && Clock::now() < give_up) {
    if (!st.wait_until_settled(std::chrono::milliseconds(100))) continue;
    const PendingItem p = st.state().pending;
    if (p.valid && p.gate.iteration == 1) seen(p);
    st.step(kind);
  }
  REQUIRE_MESSAGE(runner.finish(std::chrono::seconds(0)), "the stepped run did not end: " << st.state().waiting);
  CHECK(runner.error() == "");
}

}  // namespace

TEST_SUITE("context_parallel") {
  TEST_CASE("context parallelism equals the one-rank GPT in every layout, alone, with DDP, with TP and under FSDP") {
    // SGD with momentum: every parameter within 1e-5 of the one-rank GPT after 20 steps. AdamW divides
    // by sqrt(v), so a gradient that is rounding noise around zero (the key bias's: a constant added to
    // every key leaves the softmax unchanged) moves its parameter by up to lr either way whatever the
    // split; at nanoGPT's shakespeare_char lr, 1e-3, the parameters stay within 1e-4 and the loss within
    // 1e-5, the TP test's bound (test_gpt.cpp). The sanitizer runs (quick) take degree 2 with SGD.
    auto sgd = [](TrainConfig c) {
      c.optimizer = default_optimizer_config(OptimizerKind::SGD);
      c.optimizer.lr = 0.05;
      c.optimizer.momentum = 0.9;
      return c;
    };
    auto adamw = [](TrainConfig c) {
      c.optimizer.lr = 1e-3;
      return c;
    };
    // `c` against the one-rank GPT on `batch` samples a step.
    auto check = [](const TrainConfig& c, int64_t batch, double tol) {
      Trainer ref(reference(c, batch));
      const TrainSummary rs = ref.run();
      Trainer t(c);
      const TrainSummary ts = t.run();
      CHECK(ts.steps == c.steps);
      CHECK(test::max_abs_diff(t.result_model(), ref.result_model()) < tol);
      CHECK(std::abs(ts.eval_loss - rs.eval_loss) < 1e-5);
    };
    for (CpLayout layout : {CpLayout::Ring, CpLayout::Zigzag, CpLayout::Ulysses}) {
      const std::string name = cp_layout_name(layout);
      CAPTURE(name);
      for (int cp : {2, 4}) {
        if (cp == 4 && test::quick()) continue;
        CAPTURE(cp);
        // Alone: one CP group of cp ranks reads the reference's batches.
        check(sgd(cp_config(cp, cp, layout, 2)), 2, 1e-5);
        if (!test::quick()) check(adamw(cp_config(cp, cp, layout, 2)), 2, 1e-4);
      }
      if (test::quick()) continue;
      // With data parallelism: 2 replicas x cp 2, the reference on both replicas' samples.
      check(sgd(cp_config(4, 2, layout, 2)), 4, 1e-5);
      check(adamw(cp_config(4, 2, layout, 2)), 4, 1e-4);
      // With tensor parallelism, sequence parallel: tp 2 x cp 2 (cp next to tp: ranks 0 and 2 share a
      // CP group, and each TP rank holds half of its CP rank's positions).
      TrainConfig p = cp_config(4, 2, layout, 2);
      p.tp = 2;
      p.sequence_parallel = true;
      check(sgd(p), 2, 1e-5);
      check(adamw(p), 2, 1e-4);
      // FSDP over the dp x cp ranks: its reduce-scatter averages as DDP's all-reduce does.
      TrainConfig f = cp_config(2, 2, layout, 2);
      f.strategy = Strategy::Fsdp;
      check(sgd(f), 2, 1e-5);
    }
  }

  TEST_CASE("ring attention's sends and Ulysses' all-to-alls move the bytes of their formulas") {
    // B 2, T 16, C 16, float32, 2 blocks, cp 4: a K/V block is 2 x 2 x 4 x 16 x 4 = 1 KiB.
    const int64_t block = ring_attention_block_bytes(2, 16, 16, 4, 1, 4);
    CHECK(block == 1024);
    for (CpLayout layout : {CpLayout::Ring, CpLayout::Zigzag}) {
      const std::string name = cp_layout_name(layout);
      CAPTURE(name);
      TrainConfig c = cp_config(4, 4, layout, 2, 2);
      Trainer t(c);
      t.run();
      for (int rank = 0; rank < 4; rank++) {
        CAPTURE(rank);
        std::vector<int64_t> sends;
        for (const Event& e : t.recorder().events(rank))
          if (e.kind == EventKind::Collective && e.iteration == 1 && e.coll.op == CollectiveOp::Send) sends.push_back(e.coll.bytes);
        // Per block: c-1 K/V sends forward; backward c-1 K/V sends and c-1 dK/dV sends.
        REQUIRE(sends.size() == static_cast<size_t>(2 * (3 + 3 + 3)));
        for (int64_t b : sends) CHECK(b == block);
      }
    }
    // Ulysses: per block two all-to-alls forward (q, k, v: 3 x B x T/c x C elements; the output: 1 x)
    // and two backward (the output's gradient, then q, k and v's), each keeping 1/c at home.
    TrainConfig u = cp_config(4, 4, CpLayout::Ulysses, 2, 2);
    Trainer t(u);
    t.run();
    const int64_t rows = 2 * 16 / 4 * 16 * 4;  // B x T/c x C x 4 bytes
    for (int rank = 0; rank < 4; rank++) {
      CAPTURE(rank);
      std::vector<int64_t> bytes;
      std::map<std::string, int> groups;
      for (const Event& e : t.recorder().events(rank)) {
        if (e.kind != EventKind::Collective || e.iteration != 1 || e.coll.op != CollectiveOp::AllToAll) continue;
        bytes.push_back(e.coll.bytes);
        groups[t.recorder().label(e.coll.group - 1)]++;
      }
      CHECK(groups == std::map<std::string, int>{{"cp0: 0,1,2,3", 8}});
      REQUIRE(bytes.size() == 8);
      CHECK(bytes == std::vector<int64_t>{3 * rows, rows, 3 * rows, rows, rows, 3 * rows, rows, 3 * rows});
    }
  }

  TEST_CASE("the stepper pauses before every ring step's send and every Ulysses all-to-all, and steps an all-to-all round by round") {
    // Ring, cp 4: per block, 3 K/V sends forward, 3 K/V and 3 dK/dV sends backward; each ring step is
    // one stop of the whole group (every rank's send fused with its receive, as on NCCL).
    int sends = 0;
    step_through(cp_config(4, 4, CpLayout::Ring, 1, 2), GateKind::Collective, [&](const PendingItem& p) {
      if (p.kind != GateKind::Collective || !p.gate.op.p2p) return;
      CAPTURE(p.gate.label);
      CHECK(p.gate.label.find(" with recv ") != std::string::npos);
      CHECK(p.members == std::vector<int>{0, 1, 2, 3});
      CHECK(p.missing.empty());
      CHECK(p.gate.bytes == ring_attention_block_bytes(1, 16, 16, 4, 1, 4));
      sends++;
    });
    CHECK(sends == 2 * (3 + 3 + 3));
    // Ulysses, cp 4: 4 all-to-alls per block of the group cp0, each stepped in its 3 rounds.
    std::map<int64_t, std::vector<int>> rounds;  // all-to-all (its group seq) -> the rounds stepped
    step_through(cp_config(4, 4, CpLayout::Ulysses, 1, 2), GateKind::RingStep, [&](const PendingItem& p) {
      // (A ring step's gate names its operation in its label; the carries the op.)
      if (p.gate.op.p2p || p.gate.label.find("all_to_all") == std::string::npos) return;
      CAPTURE(p.gate.label);
      CHECK(p.gate.label.rfind("cp0 ", 0) == 0);
      CHECK(p.missing.empty());
      if (p.kind == GateKind::Collective) CHECK(p.gate.coll == CollectiveOp::AllToAll);
      if (p.kind == GateKind::Collective) rounds[p.gate.op.seq];
      if (p.kind == GateKind::RingStep) rounds[p.gate.op.seq].push_back(p.gate.step);
    });
    CHECK(rounds.size() == 8);
    for (const auto& r : rounds) {
      std::string got;
      for (int k : r.second) got += std::to_string(k) + " ";
      CHECK(got == "0 1 2 ");
    }
  }

  TEST_CASE("causal work: the contiguous ring's ranks compute 1, 2, ..., c blocks, zigzag's the same pairs each, forward and backward") {
    const int c = 4;
    TrainConfig ring = cp_config(c, c, CpLayout::Ring, 1, 1);
    Trainer rt(ring);
    rt.run();
    TrainConfig zig = cp_config(c, c, CpLayout::Zigzag, 1, 1);
    Trainer zt(zig);
    zt.run();
    std::vector<int64_t> ring_pairs, zig_pairs;
    for (int r = 0; r < c; r++) {
      CAPTURE(r);
      const GptCore::CpPass* p = rt.rank_model(r).context_parallel_core()->cp_pass(0);
      REQUIRE(p != nullptr);
      CHECK(p->backward);
      CHECK(p->blocks() == r + 1);
      // Step s holds rank r + s's block going backward (the other way round); only blocks at or
      // before the rank's own are computed.
      for (int s = 0; s < c; s++) CHECK(p->held[static_cast<size_t>(s)] == (r + s) % c);
      // The block's forward is kept beside it (the lab draws either): step s held rank r - s's block.
      const GptCore::CpPass* f = rt.rank_model(r).context_parallel_core()->cp_pass(0, false);
      REQUIRE(f != nullptr);
      CHECK_FALSE(f->backward);
      CHECK(f->steps_done == c);
      for (int s = 0; s < c; s++) CHECK(f->held[static_cast<size_t>(s)] == (r - s + c) % c);
      CHECK(f->total_pairs() == p->total_pairs());
      CHECK(rt.rank_model(r).context_parallel_core()->cp_pass(0, true) == p);
      ring_pairs.push_back(p->total_pairs());
      const GptCore::CpPass* z = zt.rank_model(r).context_parallel_core()->cp_pass(0);
      REQUIRE(z != nullptr);
      CHECK(z->blocks() == c);
      zig_pairs.push_back(z->total_pairs());
    }
    // T 16 over 4 ranks: 4 positions each; rank r's queries see 16 r + 10 keys in all (per sample and head).
    CHECK(ring_pairs == std::vector<int64_t>{10, 26, 42, 58});
    // Zigzag: 8 chunks of 2; every rank (2c - 1) 4 + 2 x 3 = 34 pairs.
    CHECK(zig_pairs == std::vector<int64_t>{34, 34, 34, 34});
    CHECK(ContextParallelSpec{4, 1, CpLayout::Zigzag}.positions(16) == std::vector<int64_t>{2, 3, 12, 13});
  }

  TEST_CASE("context parallelism under a pipeline equals the one-rank GPT in every layout, with replicas, TP and ZB-H1, and MoE the pipeline without it") {
    // p 2 stages x cp 2, SGD with momentum, 8 steps: every parameter within 1e-5 of the one-rank GPT
    // on the same batches, and the evaluation loss within 1e-5. Each stage holds its CP rank's
    // positions and sends the next stage's same CP rank those rows only.
    auto pipe = [](int dp, int tp, CpLayout layout, const char* schedule = "1f1b") {
      TrainConfig c = cp_config(2 * dp * 2 * tp, 2, layout, 4, 8);
      c.model = ModelSpec::parse("gpt:layers=4,heads=4,embd=16,ctx=16");
      c.strategy = Strategy::Pipeline;
      c.pipeline.stages = 2;
      c.pipeline.dp = dp;
      c.pipeline.microbatches = 2;
      c.pipeline.schedule = parse_schedule_kind(schedule);
      c.tp = tp;
      c.sequence_parallel = tp > 1;
      c.optimizer = default_optimizer_config(OptimizerKind::SGD);
      c.optimizer.lr = 0.05;
      c.optimizer.momentum = 0.9;
      return c;
    };
    auto check = [](const TrainConfig& c, const TrainConfig& reference_config) {
      std::vector<double> want, got;  // each step's loss: the CP ranks' positions summed into one
      Trainer ref(reference_config);
      const TrainSummary rs = ref.run([&](const StepReport& r) { want.push_back(r.loss); });
      Trainer t(c);
      const TrainSummary ts = t.run([&](const StepReport& r) { got.push_back(r.loss); });
      CHECK(ts.steps == c.steps);
      CHECK(test::max_abs_diff(t.result_model(), ref.result_model()) < 1e-5);
      CHECK(std::abs(ts.eval_loss - rs.eval_loss) < 1e-5);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); i++) CHECK(std::abs(got[i] - want[i]) < 1e-5);
    };
    for (CpLayout layout : {CpLayout::Ring, CpLayout::Zigzag, CpLayout::Ulysses}) {
      const std::string name = cp_layout_name(layout);
      CAPTURE(name);
      check(pipe(1, 1, layout), reference(pipe(1, 1, layout), 4));  // world 4: 2 stages x cp 2
      if (test::quick()) continue;
      check(pipe(2, 1, layout), reference(pipe(2, 1, layout), 8));  // world 8: 2 replicas, each a CP group per stage
      check(pipe(1, 2, layout), reference(pipe(1, 2, layout), 4));  // world 8: tp 2 with sequence parallelism inside each CP rank
    }
    // ZB-H1 splits each B into I and W: ring attention's backward runs in I.
    check(pipe(1, 1, CpLayout::Zigzag, "zb-h1"), reference(pipe(1, 1, CpLayout::Zigzag), 4));
    // A mixture of experts: each CP rank routes its own positions, the counts summed over the group.
    // The aux loss is each micro-batch's (a function of its token counts), so the reference is the
    // same pipeline without --cp.
    TrainConfig moe = pipe(1, 1, CpLayout::Ring);
    moe.moe = MoeSpec::parse("experts=4,top_k=2,aux=0.5");
    TrainConfig plain = moe;
    plain.cp = 1;
    plain.world_size = 2;
    check(moe, plain);
  }

  TEST_CASE("--cp: the replicas read different batches, a CP group's ranks the same one") {
    // DDP on 4 ranks with --cp 2 is 2 replicas: its epoch, its effective batch and what the CLI says.
    TrainConfig c = cp_config(4, 2, CpLayout::Ring, 8, 1);
    TrainConfig two = cp_config(2, 1, CpLayout::Ring, 8, 1);
    Trainer t(c), r(two);
    CHECK(t.data_replicas() == 2);
    CHECK(t.batches_per_epoch() == r.batches_per_epoch());
    CHECK(t.effective_batch() == 16);
    // A pipeline: --world is stages x dp x cp x tp.
    c.strategy = Strategy::Pipeline;
    c.pipeline.stages = 2;
    c.pipeline.dp = 1;
    c.pipeline.microbatches = 2;
    c.world_size = 8;
    CHECK(test::error_of(c) == "--world 8 is not --stages 2 x --dp 1 x --cp 2 = 4; a pipeline run has one rank per stage per CP rank per replica (drop --world)");
  }

  TEST_CASE("context parallelism's refusals name what to do instead") {
    TrainConfig c = cp_config(4, 1, CpLayout::Zigzag, 2);
    CHECK(test::error_of(c) == "--cp-layout zigzag chooses how a context-parallel group splits attention; add --cp 2 or more");
    c = cp_config(4, 3, CpLayout::Ring, 2);
    CHECK(test::error_of(c) ==
          "--cp 3 does not divide the 4 data-parallel ranks (--world); context-parallel groups are runs of --cp of them, so pick a --cp that divides 4");
    c = cp_config(4, 4, CpLayout::Zigzag, 2);
    c.model = ModelSpec::parse("gpt:layers=2,heads=4,embd=16,ctx=12");
    CHECK(test::error_of(c) ==
          "--cp 4 with --cp-layout zigzag cuts each sample's 12 positions into 8 equal chunks, which do not divide it; use a ctx that divides, or another --cp");
    c = cp_config(4, 4, CpLayout::Ulysses, 2);
    c.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=16");
    CHECK(test::error_of(c) ==
          "--cp 4 --cp-layout ulysses gives each rank whole attention heads, but the 2 heads do not divide by 4; use --cp-layout ring or zigzag, or a --cp that divides them");
    c = cp_config(4, 4, CpLayout::Ring, 2);
    c.strategy = Strategy::Pipeline;
    c.pipeline.stages = 2;
    CHECK(test::error_of(c) ==
          "--cp 4 needs --cp x --stages = 8 ranks, but --world is 4; raise --world to 8 (or a multiple of it)");
    c.world_size = 12;  // 6 data-parallel ranks a stage: enough for a group, not a whole number of them
    CHECK(test::error_of(c) ==
          "--cp 4 does not divide the 6 data-parallel ranks (--world / --stages); context-parallel groups are runs of --cp of them, so pick a --cp that divides 6");
    c = cp_config(2, 2, CpLayout::Ring, 2);
    c.strategy = Strategy::Dp;
    CHECK(test::error_of(c) == "--cp with --strategy dp: torch.nn.DataParallel has no process groups for the ring's sends; use --strategy ddp (or fsdp) with --cp");
    c = cp_config(2, 2, CpLayout::Ring, 2);
    c.model = ModelSpec::parse("mlp:2,8,3");
    c.data = "spiral";
    CHECK(test::error_of(c) == "--cp with an mlp model: it splits a sequence's positions, and an MLP's samples have none; use --model gpt (e.g. gpt-tiny)");
  }
}

}  // namespace dtlab
