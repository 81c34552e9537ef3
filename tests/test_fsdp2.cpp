// FSDP2 (--fsdp-api 2, torch's fully_shard; engine/parallel/fsdp.h): each parameter split on dim 0
// and padded on its own, reshard_after_forward true / false / N, HSDP; equal to FSDP1 and DDP, the
// bytes each rank keeps, the collectives' groups, and distributed checkpoints resharded on load.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "engine/io/sharded_checkpoint.h"
#include "engine/parallel/fsdp.h"
#include "engine/train/train.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

// mlp:2,64,64,3 (demo_config): Linear 0 (64, 2) + (64), Linear 2 (64, 64) + (64), Linear 4 (3, 64) + (3).
TrainConfig fsdp2_config(int world, int64_t steps, int reshard = kReshardTrue) {
  TrainConfig c = test::demo_config("fsdp", world, 16, steps);
  c.seed = 5;
  c.timeout_s = 20;
  c.fsdp.api = 2;
  c.fsdp.reshard_after_forward = reshard;
  return c;
}

const std::vector<std::vector<Shape>> kDemoUnits = {{{64, 2}, {64}}, {{64, 64}, {64}}, {{3, 64}, {3}}};

// Collectives of iteration 1 on `rank`: (op, group size) pairs counted.
struct Counts {
  int world_ag = 0, small_ag = 0, rs = 0, ar = 0;
};
Counts count_collectives(Trainer& t, int rank, int world) {
  Counts n;
  for (const Event& e : t.recorder().events(rank)) {
    if (e.kind != EventKind::Collective || e.iteration != 1) continue;
    if (e.coll.op == CollectiveOp::AllGather) (e.coll.group_size == world ? n.world_ag : n.small_ag)++;
    n.rs += e.coll.op == CollectiveOp::ReduceScatter;
    n.ar += e.coll.op == CollectiveOp::AllReduce;
  }
  return n;
}

}  // namespace

TEST_SUITE("fsdp2") {
  TEST_CASE("each parameter is split on dim 0 as torch.chunk splits it, padded on its own") {
    // (3, 64) over 4 ranks: one row each for ranks 0-2, rank 3's chunk is all padding.
    const Dim0Shard w = dim0_shard({3, 64}, 4);
    CHECK(w.chunk_rows == 1);
    CHECK(w.shard_numel() == 64);
    CHECK(w.padded_numel() == 256);
    CHECK(w.real_rows(2) == 1);
    CHECK(w.real_rows(3) == 0);
    // (64, 2) over 3 ranks: 22, 22, 20 rows, each shard 22 rows (44 elements).
    const Dim0Shard a = dim0_shard({64, 2}, 3);
    CHECK(a.chunk_rows == 22);
    CHECK(a.real_rows(2) == 20);
    CHECK(a.padded_numel() == 132);
    // The demo model, per rank: FSDP1 pads each unit's flat parameter (48 + 1040 + 49 at W = 4), FSDP2
    // each parameter (16x2 + 16, 16x64 + 16, 1x64 + 1 = 48 + 1040 + 65).
    const FsdpLayoutBytes b4 = fsdp_layout_bytes(kDemoUnits, 4);
    CHECK(b4.real_elems == 4547);
    CHECK(b4.fsdp1_shard_elems == 48 + 1040 + 49);
    CHECK(b4.fsdp2_shard_elems == 48 + 1040 + 65);
    CHECK(b4.fsdp1_gather_elems == 4 * (48 + 1040 + 49));
    CHECK(b4.fsdp2_gather_elems == 4 * (48 + 1040 + 65));
    const FsdpLayoutBytes b3 = fsdp_layout_bytes(kDemoUnits, 3);
    CHECK(b3.fsdp1_shard_elems == 64 + 1387 + 65);
    CHECK(b3.fsdp2_shard_elems == (44 + 22) + (22 * 64 + 22) + (64 + 1));
  }

  TEST_CASE("reshard_after_forward's text") {
    CHECK(parse_reshard_after_forward("true") == kReshardTrue);
    CHECK(parse_reshard_after_forward("false") == 0);
    CHECK(parse_reshard_after_forward("4") == 4);
    CHECK(reshard_after_forward_text(kReshardTrue) == "true");
    CHECK(reshard_after_forward_text(2) == "2");
    CHECK_THROWS_WITH_AS(parse_reshard_after_forward("0"),
                         "--reshard-after-forward 0 is not a choice; use true (free after forward), false (keep until backward) "
                         "or N (keep a 1/N shard over N ranks)",
                         Error);
    CHECK_THROWS_AS(parse_reshard_after_forward("yes"), Error);
  }

  TEST_CASE("FSDP2 trains to FSDP1's and DDP's parameters for every reshard setting") {
    struct Run {
      int world;
      int reshard;
      bool hybrid;
    };
    for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::AdamW}) {
      for (Run r : {Run{2, kReshardTrue, false}, Run{3, kReshardTrue, false}, Run{3, 0, false}, Run{4, kReshardTrue, false},
                    Run{4, 0, false}, Run{4, 2, false}, Run{4, 1, false}, Run{4, kReshardTrue, true}, Run{4, 2, true},
                    Run{8, 2, true}}) {
        CAPTURE(optimizer_name(kind));
        CAPTURE(r.world);
        CAPTURE(reshard_after_forward_text(r.reshard));
        CAPTURE(r.hybrid);
        // 20 steps; 5 under the sanitizers (DTLAB_TEST_QUICK), where this case was the slowest of the suite.
        TrainConfig f2 = fsdp2_config(r.world, test::quick() ? 5 : 20, r.reshard);
        f2.optimizer = default_optimizer_config(kind);
        if (kind == OptimizerKind::SGD) f2.optimizer.momentum = 0.9;
        if (r.hybrid) f2.fsdp.sharding = Sharding::Hybrid, f2.fsdp.node_size = r.world / 2;
        TrainConfig f1 = f2, d = f2;
        f1.fsdp.api = 1;
        f1.fsdp.reshard_after_forward = kReshardTrue;
        if (r.reshard == 0) f1.fsdp.sharding = Sharding::ShardGradOp;
        d.strategy = Strategy::Ddp;
        d.fsdp = FsdpOptions{};
        Trainer t2(f2), t1(f1), td(d);
        t2.run();
        t1.run();
        td.run();
        for (int rank = 0; rank < r.world; rank++) {
          CHECK(test::max_abs_diff(t2.rank_model(rank), t1.rank_model(rank)) <= 1e-5);
          CHECK(test::max_abs_diff(t2.rank_model(rank), td.model()) <= 1e-5);
        }
      }
    }
  }

  TEST_CASE("a GPT under FSDP2 equals FSDP1, reshard 2 included") {
    for (int reshard : {kReshardTrue, 2}) {
      TrainConfig f2 = fsdp2_config(4, 4, reshard);
      f2.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8");
      f2.data = "text";
      f2.eval_samples = 256;  // (the final evaluation: the whole text is 12k samples, most of a test run)
      f2.batch = 8;
      TrainConfig f1 = f2;
      f1.fsdp.api = 1;
      f1.fsdp.reshard_after_forward = kReshardTrue;
      Trainer t2(f2), t1(f1);
      t2.run();
      t1.run();
      CHECK(test::max_abs_diff(t2.model(), t1.model()) <= 1e-5);
    }
  }

  TEST_CASE("each rank keeps its per-parameter padded shards, reshard_after_forward sets what the forward leaves") {
    // World 4: shards 48 + 1040 + 65 elements (Linear 4's (3, 64) weight pads to 4 rows).
    const int64_t shard = 48 + 1040 + 65;
    // Padded unsharded units: 192, 4160 and 4 x 64 + 4 = 260 elements.
    struct Want {
      int reshard;
      int64_t gathered_peak;  // elements
    };
    // true: one unit at a time. The prefetched all-gather (FSDP2's default, as BACKWARD_PRE) lands in
    // its all-gather output (communication buffers); the unit's parameters are allocated at its copy-out,
    // when the unit before it has been resharded. false: every unit from its forward to its backward. 2: each unit's half stays after its forward;
    // Linear 2's backward gathers its 4160 while Linear 0's half (96) and its own half (2080) are held.
    for (Want w : {Want{kReshardTrue, 4160}, Want{0, 192 + 4160 + 260}, Want{2, 96 + 2080 + 4160}}) {
      CAPTURE(reshard_after_forward_text(w.reshard));
      Trainer t(fsdp2_config(4, 3, w.reshard));
      const TrainSummary s = t.run();
      for (int rank = 0; rank < 4; rank++) {
        const MemoryStats& m = s.rank_memory[static_cast<size_t>(rank)];
        CHECK(m.current_of(MemCategory::Parameters) == shard * 4);
        CHECK(m.current_of(MemCategory::OptimizerState) == 2 * shard * 4);  // AdamW: m and v
        CHECK(m.current_of(MemCategory::GatheredParameters) == 0);
        CHECK(m.peak_of(MemCategory::GatheredParameters) == w.gathered_peak * 4);
      }
    }
  }

  TEST_CASE("collectives: forward all-gathers over the shard group, reshard N's backward inside groups of N") {
    struct Want {
      int reshard;
      int world_ag, small_ag, rs;
    };
    for (Want w : {Want{kReshardTrue, 6, 0, 3}, Want{0, 3, 0, 3}, Want{2, 3, 3, 3}}) {
      CAPTURE(reshard_after_forward_text(w.reshard));
      Trainer t(fsdp2_config(4, 3, w.reshard));
      t.run();
      for (int rank = 0; rank < 4; rank++) {
        const Counts n = count_collectives(t, rank, 4);
        CHECK(n.world_ag == w.world_ag);
        CHECK(n.small_ag == w.small_ag);
        CHECK(n.rs == w.rs);
      }
    }
    // Each forward all-gather moves the unit's per-parameter padded shard: 48, 1040 and 65 elements a rank.
    Trainer t(fsdp2_config(4, 3));  // iteration 1 of 3: the last one also gathers for evaluation
    t.run();
    std::vector<int64_t> counts;
    for (const Event& e : t.recorder().events(0))
      if (e.kind == EventKind::Collective && e.iteration == 1 && e.coll.op == CollectiveOp::AllGather) counts.push_back(e.coll.in_count);
    REQUIRE(counts.size() == 6);
    CHECK(counts[0] == 48);
    CHECK(counts[1] == 1040);
    CHECK(counts[2] == 65);
  }

  TEST_CASE("explicit prefetch: two units ahead issue unit 2's all-gather before unit 1's lands, and train the same") {
    std::vector<float> params[3];
    for (int p : {1, 2}) {
      TrainConfig c = fsdp2_config(4, 3);
      c.fsdp.forward_prefetch = true;
      c.fsdp.prefetch = p;
      Trainer t(c);
      t.run();
      params[p].assign(t.model().params(), t.model().params() + t.model().num_params());
      // Iteration 1's forward on rank 0: where unit 2's unshard is issued against unit 1's landing.
      int at = 0, issue2 = -1, landed1 = -1;
      for (const Event& e : t.recorder().events(0)) {
        if (e.kind != EventKind::FsdpUnit || e.iteration != 1) continue;  // the forward comes first
        if (e.fsdp.unit == 2 && e.fsdp.verb == FsdpVerb::Unshard && issue2 < 0) issue2 = at;
        if (e.fsdp.unit == 1 && e.fsdp.verb == FsdpVerb::Unsharded && landed1 < 0) landed1 = at;
        at++;
      }
      CAPTURE(p);
      REQUIRE(issue2 >= 0);
      REQUIRE(landed1 >= 0);
      // One ahead: unit 1's forward waits for its own parameters, then issues unit 2's. Two ahead: unit
      // 0's forward issued both.
      CHECK((issue2 < landed1) == (p == 2));
    }
    CHECK(test::max_abs_diff(params[1], params[2]) == 0);
  }

  TEST_CASE("a distributed checkpoint saved by FSDP2 on 4 ranks loads on 2, into FSDP1 and FSDP2") {
    test::TempDir dir;
    TrainConfig save = fsdp2_config(4, 4);
    save.save_path = dir.file("full.safetensors");
    save.save_sharded_path = dir.file("dcp");
    Trainer(save).run();
    for (int r = 0; r < 4; r++) CHECK(std::filesystem::exists(dir.file("dcp/" + shard_file_name(r, 4))));
    Model full(save.model, nullptr, 0), sharded(save.model, nullptr, 1);
    load_checkpoint(save.save_path, full);
    load_sharded_checkpoint(save.save_sharded_path, sharded);
    CHECK(test::max_abs_diff(full, sharded) == 0);
    for (int api : {1, 2}) {
      CAPTURE(api);
      TrainConfig a = fsdp2_config(2, 3), b = a;
      a.fsdp.api = b.fsdp.api = api;
      a.init_path = dir.file("dcp");
      b.init_path = dir.file("full.safetensors");
      Trainer ta(a), tb(b);
      CHECK(ta.run().start_step == 4);
      tb.run();
      CHECK(test::max_abs_diff(ta.model(), tb.model()) == 0);
    }
  }
}
