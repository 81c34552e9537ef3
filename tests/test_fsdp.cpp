// FSDP and ZeRO-1 (engine/parallel/fsdp): the flat-parameter split and FSDP1's averaging factors,
// equivalence with DDP for every strategy, collectives per iteration, and the memory each keeps.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "engine/parallel/fsdp.h"
#include "engine/train/train.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

TrainConfig config(const std::string& strategy, int world, int64_t steps) {
  TrainConfig c = test::demo_config(strategy, world, 16, steps);  // FSDP units of 192, 4160 and 195 elements
  c.seed = 5;
  c.timeout_s = 20;
  return c;
}

using test::max_abs_diff;

const char* name(Sharding s) { return sharding_name(s); }

// The DDP run every strategy must match: 20 steps, SGD with momentum 0.9 or AdamW.
TrainConfig reference_config(int world, OptimizerKind kind) {
  TrainConfig d = config("ddp", world, 20);
  d.optimizer = default_optimizer_config(kind);
  if (kind == OptimizerKind::SGD) d.optimizer.momentum = 0.9;
  return d;
}

}  // namespace

TEST_SUITE("fsdp") {
  TEST_CASE("flat parameter split and FSDP1's averaging factors") {
    FlatShard s = flat_shard(5, 4);  // docs/course_sources.md §11: N=5, W=4 -> 2, 2, 1, 0 real + padding
    CHECK(s.chunk == 2);
    CHECK(s.padded == 8);
    CHECK(s.real(0) == 2);
    CHECK(s.real(1) == 2);
    CHECK(s.real(2) == 1);
    CHECK(s.real(3) == 0);
    FlatShard t = flat_shard(4160, 3);
    CHECK(t.chunk == 1387);
    CHECK(t.real(2) == 4160 - 2 * 1387);
    CHECK(fsdp_predivide_factor(8) == 4);  // then post-divide by 8 / 4 = 2
    CHECK(fsdp_predivide_factor(4) == 2);
    CHECK(fsdp_predivide_factor(2) == 2);  // then post-divide by 1
    CHECK(fsdp_predivide_factor(3) == 2);  // torch: 3 % 2 != 0 stops the doubling, post-divide 1.5
    CHECK(fsdp_predivide_factor(16) == 4);
  }

  TEST_CASE("every strategy trains to DDP's parameters") {
    for (int world : {2, 3, 4}) {
      for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::AdamW}) {
        const TrainConfig d = reference_config(world, kind);
        Trainer ref(d);
        ref.run();
        for (Sharding sh : {Sharding::FullShard, Sharding::ShardGradOp, Sharding::NoShard, Sharding::Zero1}) {
          for (bool wrap_layers : {true, false}) {
            CAPTURE(world);
            CAPTURE(optimizer_name(kind));
            CAPTURE(name(sh));
            CAPTURE(wrap_layers);
            TrainConfig f = d;
            f.strategy = Strategy::Fsdp;
            f.fsdp.sharding = sh;
            f.fsdp.wrap_layers = wrap_layers;
            Trainer t(f);
            t.run();
            for (int r = 0; r < world; r++) CHECK(max_abs_diff(t.rank_model(r), ref.model()) <= 1e-5);
          }
        }
      }
    }
  }

  TEST_CASE("prefetch: without it one unit is gathered at a time, with it the next one joins") {
    for (BackwardPrefetch p : {BackwardPrefetch::None, BackwardPrefetch::Pre, BackwardPrefetch::Post}) {
      for (bool fwd : {false, true}) {
        CAPTURE(backward_prefetch_name(p));
        CAPTURE(fwd);
        TrainConfig c = config("fsdp", 3, 4);
        c.fsdp.backward_prefetch = p;
        c.fsdp.forward_prefetch = fwd;
        Trainer t(c);
        TrainSummary s = t.run();
        const int64_t peak = s.rank_memory[0].peak_of(MemCategory::GatheredParameters);
        // World 3 pads 4160 to 4161 and 195 to 195, 192 to 192.
        if (p == BackwardPrefetch::None && !fwd) CHECK(peak == 4161 * 4);
        else CHECK(peak > 4161 * 4);
        // Prefetching moves all-gathers earlier; it never changes the result.
        TrainConfig d = config("ddp", 3, 4);
        Trainer ref(d);
        ref.run();
        CHECK(max_abs_diff(t.model(), ref.model()) <= 1e-5);
      }
    }
  }

  TEST_CASE("collectives per iteration follow the strategy") {
    struct Want {
      Sharding sharding;
      int all_gathers, reduce_scatters, all_reduces;  // per iteration and rank, the loss's all-reduce included
    };
    // Three units (Linear 0, 2, 4).
    for (Want w : {Want{Sharding::FullShard, 6, 3, 1}, Want{Sharding::ShardGradOp, 3, 3, 1},
                   Want{Sharding::NoShard, 0, 0, 4}, Want{Sharding::Zero1, 1, 0, 4}}) {
      CAPTURE(name(w.sharding));
      TrainConfig c = config("fsdp", 4, 3);
      c.fsdp.sharding = w.sharding;
      Trainer t(c);
      t.run();
      for (int rank = 0; rank < 4; rank++) {
        int ag = 0, rs = 0, ar = 0;
        for (const Event& e : t.recorder().events(rank)) {
          if (e.kind != EventKind::Collective || e.iteration != 1) continue;
          ag += e.coll.op == CollectiveOp::AllGather;
          rs += e.coll.op == CollectiveOp::ReduceScatter;
          ar += e.coll.op == CollectiveOp::AllReduce;
        }
        CHECK(ag == w.all_gathers);
        CHECK(rs == w.reduce_scatters);
        CHECK(ar == w.all_reduces);
      }
    }
  }

  TEST_CASE("what each rank keeps: shards, gathered units, optimizer state") {
    // World 4: chunks of 48, 1040 and 49 elements (the last unit padded from 195 to 196).
    const int64_t shard = 48 + 1040 + 49, P = 4547;
    for (Sharding sh : {Sharding::FullShard, Sharding::ShardGradOp, Sharding::NoShard, Sharding::Zero1}) {
      CAPTURE(name(sh));
      TrainConfig c = config("fsdp", 4, 3);
      c.fsdp.sharding = sh;
      Trainer t(c);
      TrainSummary s = t.run();
      const MemoryStats& m = s.rank_memory[1];
      const bool sharded = sh == Sharding::FullShard || sh == Sharding::ShardGradOp;
      CHECK(m.current_of(MemCategory::Parameters) == (sharded ? shard : P) * 4);
      CHECK(m.current_of(MemCategory::Gradients) == (sharded ? shard : P) * 4);
      const int64_t opt_elems = sh == Sharding::NoShard ? P : sh == Sharding::Zero1 ? (P + 3) / 4 : shard;
      CHECK(m.current_of(MemCategory::OptimizerState) == 2 * opt_elems * 4);  // AdamW: m and v
      CHECK(m.current_of(MemCategory::GatheredParameters) == 0);             // freed by the end
      // BACKWARD_PRE (the default) gathers the next unit while the current one is still held:
      // Linear 4 (196 padded) and Linear 2 (4160) are live together.
      if (sh == Sharding::FullShard) CHECK(m.peak_of(MemCategory::GatheredParameters) == (196 + 4160) * 4);
      if (sh == Sharding::ShardGradOp)
        CHECK(m.peak_of(MemCategory::GatheredParameters) == (192 + 4160 + 196) * 4);  // every unit kept
      if (!sharded) CHECK(m.peak_of(MemCategory::GatheredParameters) == 0);
    }
  }

  // torch frees a unit's unsharded gradient once its reduce-scatter has run (the post-backward stream's
  // record_stream), not at the end of the backward: a rank holds its gradient shard plus at most two
  // units' full gradients (the one being reduced, the next one being computed). Holding every unit's
  // until the end put FSDP's gradient peak above DDP's whole model.
  TEST_CASE("a unit's full-size gradient is freed once its reduce-scatter has run") {
    // mlp:2,64,64,64,64,64,64,3: units of 192, 5 x 4160 and 195 elements. The shard of a rank: FSDP1
    // splits each flat unit, FSDP2 each parameter's rows (the last Linear's 3 rows padded to a row a rank).
    const int64_t unit = 4160;
    for (Sharding sh : {Sharding::FullShard, Sharding::ShardGradOp, Sharding::Hybrid}) {
      for (int api : {1, 2}) {
        if (api == 2 && sh == Sharding::ShardGradOp) continue;  // fully_shard: reshard_after_forward=False instead
        CAPTURE(name(sh));
        CAPTURE(api);
        TrainConfig c = config("fsdp", 4, 3);
        c.model = ModelSpec::parse("mlp:2,64,64,64,64,64,64,3");
        c.fsdp.sharding = sh;
        c.fsdp.api = api;
        if (sh == Sharding::Hybrid) c.fsdp.node_size = 2;  // shards of 2 ranks: twice the elements
        Trainer t(c);
        const TrainSummary s = t.run();
        const bool hybrid = sh == Sharding::Hybrid;
        const int64_t mine = api == 1 ? (hybrid ? 96 + 5 * 2080 + 98 : 48 + 5 * 1040 + 49)
                                      : (hybrid ? 96 + 5 * 2080 + 130 : 48 + 5 * 1040 + 65);
        // FSDP1 reduce-scatters from the unit's gradient itself, so it stays until the reduce-scatter
        // has run (two units: the previous one's reduction overlaps this one's backward); FSDP2 copies
        // it into the reduce-scatter's input (chunk_cat) and frees it at once.
        const int64_t held = api == 1 ? 2 * unit : unit;
        for (int r = 0; r < 4; r++) {
          CAPTURE(r);
          CHECK(s.rank_memory[static_cast<size_t>(r)].peak_of(MemCategory::Gradients) == (mine + held) * 4);
        }
      }
    }
  }

  // Issue 34: --accum was refused with FSDP. As torch's FSDP without no_sync(), every micro-batch's
  // backward reduce-scatters and the reduced shards add up; the step then equals DDP's with the
  // same accumulation (which all-reduces only the last micro-batch's bucket sums).
  TEST_CASE("gradient accumulation: every sharding equals DDP with the same --accum") {
    for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::AdamW}) {
      TrainConfig d = reference_config(4, kind);
      d.steps = 10;
      d.accum = 3;
      Trainer ref(d);
      ref.run();
      for (Sharding sh : {Sharding::FullShard, Sharding::ShardGradOp, Sharding::NoShard, Sharding::Zero1, Sharding::Hybrid}) {
        CAPTURE(optimizer_name(kind));
        CAPTURE(name(sh));
        TrainConfig f = d;
        f.strategy = Strategy::Fsdp;
        f.fsdp.sharding = sh;
        if (sh == Sharding::Hybrid) f.fsdp.node_size = 2;
        Trainer t(f);
        const TrainSummary s = t.run();
        CHECK(s.effective_batch == 16 * 4 * 3);
        for (int r = 0; r < 4; r++) CHECK(max_abs_diff(t.rank_model(r), ref.model()) <= 1e-5);
      }
    }
  }

  TEST_CASE("HYBRID_SHARD: shard inside node groups, replicate across them, equal to DDP") {
    for (int world : {2, 3, 4}) {
      for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::AdamW}) {
        const TrainConfig d = reference_config(world, kind);
        Trainer ref(d);
        ref.run();
        for (int node = 1; node <= world; node++) {
          if (world % node != 0) continue;
          CAPTURE(world);
          CAPTURE(node);
          CAPTURE(optimizer_name(kind));
          TrainConfig f = d;
          f.strategy = Strategy::Fsdp;
          f.fsdp.sharding = Sharding::Hybrid;
          f.fsdp.node_size = node;
          Trainer t(f);
          TrainSummary s = t.run();
          for (int r = 0; r < world; r++) CHECK(max_abs_diff(t.rank_model(r), ref.model()) <= 1e-5);
          // Each rank keeps 1/node of every unit: 4547 parameters in chunks of ceil(n/node).
          int64_t shard = 0;
          for (int64_t n : {192, 4160, 195}) shard += (n + node - 1) / node;
          CHECK(s.rank_memory[static_cast<size_t>(world - 1)].current_of(MemCategory::Parameters) == shard * 4);
        }
      }
    }
  }

  TEST_CASE("HYBRID_SHARD's node size: from the flag, else the profile's ranks per node") {
    TrainConfig c = config("fsdp", 8, 1);
    c.fsdp.sharding = Sharding::Hybrid;
    c.profile = "ib2x4";  // 2 nodes of 4 ranks
    Trainer t(c);
    CHECK(t.config().fsdp.node_size == 4);
    c.profile = "nvlink8";  // one node of 8: no groups to form
    CHECK_THROWS_WITH_AS(Trainer{c}, doctest::Contains("pass --node-size K"), Error);
    c.fsdp.node_size = 3;
    CHECK_THROWS_WITH_AS(Trainer{c}, "--node-size 3 does not divide --world 8; HYBRID_SHARD needs equal node groups",
                         Error);
  }

  TEST_CASE("each unit walks FSDP2's states, verbs per iteration follow the strategy") {
    struct Want {
      Sharding sharding;
      int unshards, reshards, reductions;  // per unit and iteration
    };
    // FULL_SHARD gathers twice (forward, backward) and frees twice; SHARD_GRAD_OP once each.
    for (Want w : {Want{Sharding::FullShard, 2, 2, 1}, Want{Sharding::ShardGradOp, 1, 1, 1},
                   Want{Sharding::Hybrid, 2, 2, 1}, Want{Sharding::NoShard, 0, 0, 1}}) {
      CAPTURE(name(w.sharding));
      TrainConfig c = config("fsdp", 4, 3);
      c.fsdp.sharding = w.sharding;
      if (w.sharding == Sharding::Hybrid) c.fsdp.node_size = 2;
      Trainer t(c);
      t.run();
      for (int rank = 0; rank < 4; rank++) {
        int unshard[3] = {}, reshard[3] = {}, reduce[3] = {}, layout = 0;
        std::string states;
        for (const Event& e : t.recorder().events(rank)) {
          if (e.kind != EventKind::FsdpUnit) continue;
          if (e.fsdp.verb == FsdpVerb::Layout) {
            layout++;
            CHECK(e.fsdp.shard_world == (w.sharding == Sharding::Hybrid ? 2 : 4));
          }
          if (e.iteration != 1) continue;
          const int u = e.fsdp.unit;
          unshard[u] += e.fsdp.verb == FsdpVerb::Unshard;
          reshard[u] += e.fsdp.verb == FsdpVerb::Reshard;
          reduce[u] += e.fsdp.verb == FsdpVerb::ReduceGrad;
          if (u == 1 && (e.fsdp.verb == FsdpVerb::Unsharded || e.fsdp.verb == FsdpVerb::ReduceGrad ||
                         e.fsdp.verb == FsdpVerb::GradReduced))
            states += std::string(fsdp_state_name(e.fsdp.state)) + " ";
        }
        CHECK(layout == 3);
        for (int u = 0; u < 3; u++) {
          CHECK(unshard[u] == w.unshards);
          CHECK(reshard[u] == w.reshards);
          CHECK(reduce[u] == w.reductions);
        }
        // The middle unit: gathered in FORWARD, again in PRE_BACKWARD (FULL_SHARD), reduced in
        // POST_BACKWARD, and IDLE once the reduction is waited for.
        if (w.sharding == Sharding::FullShard || w.sharding == Sharding::Hybrid)
          CHECK(states == "FORWARD PRE_BACKWARD POST_BACKWARD IDLE ");
        if (w.sharding == Sharding::ShardGradOp) CHECK(states == "FORWARD POST_BACKWARD IDLE ");
        if (w.sharding == Sharding::NoShard) CHECK(states == "POST_BACKWARD IDLE ");
      }
    }
  }
}
