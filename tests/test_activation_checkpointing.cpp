// Activation checkpointing (torch.utils.checkpoint per Linear+ReLU block;
// docs/course_sources.md §6d): bit-identical gradients and trained weights with
// and without it, the recompute reported as its own kind of compute, FSDP's
// gathers around the recompute, and the activation bytes the planner predicts.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/core/memory.h"
#include "engine/core/model.h"
#include "engine/parallel/memory_plan.h"
#include "engine/train/train.h"
#include "tests/cli_util.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

// One forward and backward of `spec` on a batch of B; the gradients, and the
// Activations bytes the model's tracker saw (current after backward, peak).
struct Pass {
  std::vector<float> logits, grads;
  int64_t current = 0, peak = 0;
};

Pass one_pass(const ModelSpec& spec, int64_t B, bool checkpointing) {
  MemoryTracker mem;
  Model m(spec, &mem, 3);
  m.set_activation_checkpointing(checkpointing);
  const std::vector<float> x = test::random_floats(static_cast<size_t>(B * spec.in_features()), 7);
  const std::vector<float> dl = test::random_floats(static_cast<size_t>(B * spec.out_features()), 11);
  m.zero_grad();
  const float* logits = m.forward(x.data(), B);
  Pass p;
  p.logits.assign(logits, logits + B * spec.out_features());
  m.backward(dl.data());
  p.grads.assign(m.grads(), m.grads() + m.num_params());
  p.current = mem.stats().current_of(MemCategory::Activations);
  p.peak = mem.stats().peak_of(MemCategory::Activations);
  return p;
}

TrainConfig run_config(const std::string& strategy, int world, OptimizerKind kind) {
  TrainConfig c = test::demo_config(strategy, world, 16, 4);
  c.optimizer = default_optimizer_config(kind);
  c.optimizer.lr = 0.01;
  if (kind == OptimizerKind::SGD) c.optimizer.momentum = 0.9;
  c.seed = 5;
  c.timeout_s = 20;
  return c;
}

// Per rank, in iteration 1: all-gathers, and the recompute's compute events.
struct Counts {
  int all_gathers = 0, recomputes = 0;
  double recompute_flops = 0, forward_flops = 0;
};

Counts counts(Trainer& t, int rank) {
  Counts k;
  for (const Event& e : t.recorder().events(rank)) {
    if (e.iteration != 1) continue;
    if (e.kind == EventKind::Collective) k.all_gathers += e.coll.op == CollectiveOp::AllGather;
    if (e.kind != EventKind::Compute) continue;
    if (e.compute.kind == ComputeKind::Recompute) k.recomputes++, k.recompute_flops += e.compute.flops;
    if (e.compute.kind == ComputeKind::LayerForward) k.forward_flops += e.compute.flops;
  }
  return k;
}

// Runs `c` without and with checkpointing and hands both trainers and summaries
// to `check`.
template <class Check>
void both_ways(TrainConfig c, const Check& check) {
  Trainer plain(c);
  const TrainSummary p = plain.run();
  c.activation_checkpointing = true;
  Trainer ckpt(c);
  const TrainSummary k = ckpt.run();
  check(plain, p, ckpt, k);
}

}  // namespace

TEST_SUITE("activation_checkpointing") {
  TEST_CASE("one pass: the same logits and gradients bit for bit, the predicted activation bytes") {
    for (const char* text : {"mlp:2,64,64,3", "mlp:2,64,64,64,3", "mlp:5,3,17,8,2", "mlp:4,9", "mlp:3,2,40"}) {
      for (int64_t B : {1, 7, 64}) {
        CAPTURE(text);
        CAPTURE(B);
        const ModelSpec spec = ModelSpec::parse(text);
        const Pass plain = one_pass(spec, B, false), ckpt = one_pass(spec, B, true);
        CHECK(ckpt.logits == plain.logits);
        CHECK(ckpt.grads == plain.grads);
        CHECK(plain.current == mlp_activation_bytes(spec, B, false));
        CHECK(plain.peak == plain.current);
        CHECK(ckpt.current == mlp_activation_bytes(spec, B, true));
        CHECK(ckpt.peak == ckpt.current);
      }
    }
    // The demo model at batch 64: 5 outputs of 64, 64, 64, 64, 3 plus two
    // gradient buffers of 64 wide, against 3 block outputs (64, 64, 3) plus one
    // recompute buffer of 64.
    const ModelSpec demo = ModelSpec::parse("mlp:2,64,64,3");
    CHECK(mlp_activation_bytes(demo, 64, false) == (64 * 4 + 3 + 2 * 64) * 64 * 4);
    CHECK(mlp_activation_bytes(demo, 64, true) == (64 * 2 + 3 + 64 + 2 * 64) * 64 * 4);
  }

  TEST_CASE("final weights are bit-identical with and without it: single, ddp, fsdp") {
    struct Run {
      const char* strategy;
      int world;
    };
    for (Run r : {Run{"single", 1}, Run{"ddp", 2}, Run{"ddp", 4}, Run{"fsdp", 2}, Run{"fsdp", 4}}) {
      for (OptimizerKind kind : {OptimizerKind::SGD, OptimizerKind::AdamW}) {
        CAPTURE(r.strategy);
        CAPTURE(r.world);
        CAPTURE(optimizer_name(kind));
        both_ways(run_config(r.strategy, r.world, kind),
                  [](Trainer& plain, const TrainSummary&, Trainer& ckpt, const TrainSummary&) {
                    CHECK(ckpt.model().host_params() == plain.model().host_params());
                  });
      }
    }
  }

  TEST_CASE("the recompute is its own compute kind and costs one more forward") {
    both_ways(run_config("ddp", 2, OptimizerKind::AdamW), [](Trainer& plain, const TrainSummary&, Trainer& ckpt,
                                                             const TrainSummary&) {
      for (int rank = 0; rank < 2; rank++) {
        const Counts p = counts(plain, rank), k = counts(ckpt, rank);
        CHECK(p.recomputes == 0);
        CHECK(k.recomputes == 5);  // Linear 0, ReLU 1, Linear 2, ReLU 3, Linear 4
        CHECK(k.recompute_flops == k.forward_flops);
        CHECK(k.forward_flops == p.forward_flops);
      }
      // Block by block: each block's recompute runs right before its
      // backward, the last block first.
      std::vector<std::string> order;
      for (const Event& e : ckpt.recorder().events(0))
        if (e.iteration == 1 && e.kind == EventKind::Compute &&
            (e.compute.kind == ComputeKind::Recompute || e.compute.kind == ComputeKind::LayerBackward))
          order.push_back(std::string(compute_kind_name(e.compute.kind)) + " " + std::to_string(e.compute.layer));
      const std::vector<std::string> want = {"recompute 4", "backward 4",  "recompute 2", "recompute 3", "backward 3",
                                             "backward 2",  "recompute 0", "recompute 1", "backward 1",  "backward 0"};
      CHECK(order == want);
    });
  }

  TEST_CASE("FSDP gathers a resharded unit again for its recompute") {
    // Three units (Linear 0, 2, 4). FULL_SHARD frees each after its forward:
    // the recompute gathers it again and frees it, then its backward gathers it
    // once more (3 + 3 + 3). SHARD_GRAD_OP keeps the forward's copy, so the
    // recompute costs no collective; so does one unit for the whole model (the
    // root keeps its parameters from forward to backward).
    struct Want {
      Sharding sharding;
      bool wrap_layers;
      int plain, checkpointed;
    };
    for (Want w : {Want{Sharding::FullShard, true, 6, 9}, Want{Sharding::ShardGradOp, true, 3, 3},
                   Want{Sharding::FullShard, false, 1, 1}}) {
      CAPTURE(sharding_name(w.sharding));
      CAPTURE(w.wrap_layers);
      TrainConfig c = run_config("fsdp", 4, OptimizerKind::AdamW);
      c.fsdp.sharding = w.sharding;
      c.fsdp.wrap_layers = w.wrap_layers;
      both_ways(c, [&w](Trainer& plain, const TrainSummary&, Trainer& ckpt, const TrainSummary&) {
        for (int rank = 0; rank < 4; rank++) {
          CHECK(counts(plain, rank).all_gathers == w.plain);
          CHECK(counts(ckpt, rank).all_gathers == w.checkpointed);
        }
        CHECK(ckpt.model().host_params() == plain.model().host_params());
      });
    }
  }

  TEST_CASE("a run's activations peak drops by the planner's predicted amount") {
    for (const char* text : {"mlp:2,64,64,3", "mlp:2,32,48,64,3"}) {
      CAPTURE(text);
      TrainConfig c = run_config("single", 1, OptimizerKind::AdamW);
      c.model = ModelSpec::parse(text);
      both_ways(c, [&c](Trainer&, const TrainSummary& p, Trainer&, const TrainSummary& k) {
        const int64_t drop = p.memory.peak_of(MemCategory::Activations) - k.memory.peak_of(MemCategory::Activations);
        CHECK(drop == mlp_activation_bytes(c.model, c.batch, false) - mlp_activation_bytes(c.model, c.batch, true));
        CHECK(drop > 0);
      });
    }
  }

  TEST_CASE("a pipeline recomputes each stage's blocks: the same weights, fewer activation bytes, recompute events") {
    for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZBH1, ScheduleKind::Interleaved1F1B}) {
      const bool interleaved = kind == ScheduleKind::Interleaved1F1B;
      CAPTURE(schedule_kind_name(kind));
      TrainConfig c = run_config("pipeline", 4, OptimizerKind::AdamW);
      c.model = ModelSpec::parse(interleaved ? "mlp:2,16,16,16,16,16,16,16,3" : "mlp:2,16,16,16,3");
      c.batch = 16;
      c.steps = 3;
      c.pipeline.stages = 4;
      c.pipeline.microbatches = 8;
      c.pipeline.schedule = kind;
      c.pipeline.chunks = interleaved ? 2 : 1;
      both_ways(c, [kind, interleaved](Trainer& plain, const TrainSummary& p, Trainer& ckpt, const TrainSummary& k) {
        CHECK(ckpt.model().host_params() == plain.model().host_params());  // the same kernels in the same order
        for (int rank = 0; rank < 4; rank++) {
          CAPTURE(rank);
          const Counts pc = counts(plain, rank), kc = counts(ckpt, rank);
          CHECK(pc.recomputes == 0);
          // Every layer of every micro-batch runs forward once more: 8 x (Linear + ReLU) per stage, the
          // model's last Linear alone (interleaved: two stages per rank, the last rank's second one last).
          const int layers = interleaved ? (rank == 3 ? 3 : 4) : (rank == 3 ? 1 : 2);
          CHECK(kc.recomputes == layers * 8);
          CHECK(kc.recompute_flops == kc.forward_flops);
          CHECK(kc.forward_flops == pc.forward_flops);
        }
        if (kind == ScheduleKind::GPipe) {
          // Rank 1 holds Linear 1 (16 -> 16) and its ReLU; GPipe holds all 8 micro-batches of 2 rows. Without
          // checkpointing each keeps its input, the Linear's and the ReLU's outputs (3 x 2 x 16 floats); with
          // it the input and the ReLU's (2 x 2 x 16), and the rank one shared buffer for the Linear's output
          // (2 x 16). Both add B's two gradient buffers of one micro-batch (2 x 2 x 16).
          CHECK(p.rank_memory[1].peak_of(MemCategory::Activations) == (8 * 3 * 2 * 16 + 2 * 2 * 16) * 4);
          CHECK(k.rank_memory[1].peak_of(MemCategory::Activations) == (8 * 2 * 2 * 16 + 2 * 16 + 2 * 2 * 16) * 4);
        }
        for (size_t rank = 0; rank < 3; rank++)  // the last rank's last Linear is a block of its own: nothing to drop
          CHECK(k.rank_memory[rank].peak_of(MemCategory::Activations) < p.rank_memory[rank].peak_of(MemCategory::Activations));
      });
    }
  }

  // --precision with --activation-checkpointing (issue 34): the block recomputes in 16 bits as its
  // forward ran, so after 3 steps the 16-bit gradients and weights equal the run that kept its
  // activations bit for bit, and the kept activations, all 16-bit, drop by half of fp32's drop.
  TEST_CASE("bf16 and fp16: the 16-bit recompute leaves gradients and weights bit-identical, activations drop by half fp32's drop") {
    struct Run {
      const char* strategy;
      int world;
    };
    for (const Precision prec : {Precision::BF16, Precision::FP16}) {
      for (Run r : {Run{"single", 1}, Run{"ddp", 2}, Run{"fsdp", 2}}) {
        CAPTURE(precision_name(prec));
        CAPTURE(r.strategy);
        TrainConfig c = run_config(r.strategy, r.world, OptimizerKind::AdamW);
        c.steps = 3;
        c.precision = prec;
        both_ways(c, [&](Trainer& plain, const TrainSummary& p, Trainer& ckpt, const TrainSummary& k) {
          for (int rank = 0; rank < r.world; rank++) {
            CAPTURE(rank);
            Model& a = plain.rank_model(rank);
            Model& b = ckpt.rank_model(rank);
            REQUIRE(b.precision() == prec);
            CHECK(b.host_params() == a.host_params());
            if (std::string(r.strategy) == "fsdp") continue;  // FSDP's gradients are fp32 shards, checked by the weights
            REQUIRE(a.grads16() != nullptr);
            const std::vector<uint16_t> ga(a.grads16(), a.grads16() + a.num_params());
            const std::vector<uint16_t> gb(b.grads16(), b.grads16() + b.num_params());
            CHECK(gb == ga);
          }
          const int64_t drop = p.memory.peak_of(MemCategory::Activations) - k.memory.peak_of(MemCategory::Activations);
          CHECK(2 * drop == mlp_activation_bytes(c.model, c.batch, false) - mlp_activation_bytes(c.model, c.batch, true));
          CHECK(drop > 0);
        });
      }
    }
  }

  TEST_CASE("dtlab-cli train prints the activations' peak beside the prediction, and runs a pipeline and --tp with it") {
    const test::CliResult r = test::run_cli(
        {"train", "--model", "mlp:2,64,64,64,3", "--steps", "3", "--activation-checkpointing"});
    CHECK(r.code == 0);
    // (4 x 64 kept + 64 recompute + 2 x 64 gradients) x 64 rows x 4 bytes, plus the loss's 2 x 64 x 3 floats.
    CHECK(r.out.find("activation checkpointing: activations peak 98.2 KiB; predicted 98.2 KiB (130.2 KiB without, "
                     "32.0 KiB saved;") != std::string::npos);
    const test::CliResult p =
        test::run_cli({"train", "--strategy", "pipeline", "--world", "2", "--steps", "1", "--activation-checkpointing"});
    CHECK(p.code == 0);
    CHECK(p.err.empty());
    CHECK(p.out.find("activation checkpointing: each stage keeps only its blocks' outputs") != std::string::npos);
    // On a tensor-parallel shard the run replays f and g; the planner's figure is for unsplit models.
    const test::CliResult tp = test::run_cli(
        {"train", "--strategy", "ddp", "--world", "2", "--tp", "2", "--steps", "3", "--activation-checkpointing"});
    CHECK(tp.code == 0);
    CHECK(tp.out.find(" on each --tp 2 shard (the planner predicts unsplit models only)") != std::string::npos);
  }
}
