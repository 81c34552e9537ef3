// torch.nn.DataParallel (engine/parallel/data_parallel, the dp strategy): torch.chunk's pieces and
// the two coalescing rules, equivalence with one rank on the combined batch, the bytes every step
// moves (read from the recorder's events), who holds what in memory, and the sentences for
// combinations that make no sense.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/parallel/data_parallel.h"
#include "engine/train/compose.h"
#include "engine/train/device_select.h"
#include "engine/train/train.h"
#include "tests/cli_util.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

using Groups = std::vector<std::vector<int>>;

// mlp:2,64,64,3: P = 4547 floats, S = 18188 bytes.
constexpr int64_t kP = 4547, kS = kP * 4;

TrainConfig dp_config(int world, int64_t batch, int64_t steps) {
  TrainConfig c;
  c.strategy = Strategy::Dp;
  c.world_size = world;
  c.model = ModelSpec::parse("mlp:2,64,64,3");
  c.data = "spiral";  // 3000 samples
  c.batch = batch;
  c.steps = steps;
  c.optimizer = default_optimizer_config(OptimizerKind::AdamW);
  c.seed = 3;
  c.timeout_s = 20;
  return c;
}

using test::error_of;

using test::for_each_reference_case;
using test::max_abs_diff;
using test::single_like;
using test::train;
using test::Trained;

}  // namespace

TEST_SUITE("data_parallel") {
  TEST_CASE("the batch is cut as torch.chunk cuts it: ceil(rows / devices) rows a piece, maybe fewer pieces") {
    CHECK(chunk_sizes(256, 4) == std::vector<int64_t>{64, 64, 64, 64});
    CHECK(chunk_sizes(10, 4) == std::vector<int64_t>{3, 3, 3, 1});
    CHECK(chunk_sizes(7, 4) == std::vector<int64_t>{2, 2, 2, 1});
    CHECK(chunk_sizes(5, 4) == std::vector<int64_t>{2, 2, 1});  // three pieces for four devices
    CHECK(chunk_sizes(3, 4) == std::vector<int64_t>{1, 1, 1});
    CHECK(chunk_sizes(1, 4) == std::vector<int64_t>{1});
    CHECK(chunk_sizes(9, 1) == std::vector<int64_t>{9});
    CHECK(chunk_sizes(0, 3).empty());
  }

  TEST_CASE("replicate and ReduceAddCoalesced coalesce by different rules, both 10 MiB by default") {
    // take_tensors (torch/csrc/utils/tensor_flatten.cpp, broadcast_coalesced): add, then close the
    // group once it holds the limit or more. _take_tensors (torch/_utils.py, reduce_add_coalesced):
    // close the group before a tensor that would take it past the limit.
    CHECK(broadcast_coalesced_groups({4, 4, 4}, 8) == Groups{{0, 1}, {2}});
    CHECK(reduce_add_coalesced_groups({4, 4, 4}, 8) == Groups{{0, 1}, {2}});
    CHECK(broadcast_coalesced_groups({6, 4, 6}, 8) == Groups{{0, 1}, {2}});
    CHECK(reduce_add_coalesced_groups({6, 4, 6}, 8) == Groups{{0}, {1}, {2}});
    CHECK(broadcast_coalesced_groups({20, 2}, 8) == Groups{{0}, {1}});  // larger than the limit: alone
    CHECK(reduce_add_coalesced_groups({2, 20, 2}, 8) == Groups{{0}, {1}, {2}});
    CHECK(kDpCoalesceBytes == 10485760);
    const std::vector<int64_t> mlp = {512, 256, 16384, 256, 768, 12};  // mlp:2,64,64,3: one buffer each way
    CHECK(broadcast_coalesced_groups(mlp, kDpCoalesceBytes) == Groups{{0, 1, 2, 3, 4, 5}});
    CHECK(reduce_add_coalesced_groups(mlp, kDpCoalesceBytes) == Groups{{0, 1, 2, 3, 4, 5}});
  }

  TEST_CASE("dp on N devices equals one rank on the combined batch") {
    // 12 x 16 x 4 x 2 samples: inside the first epoch
    for_each_reference_case([](int world) { return dp_config(world, 16, 12); }, [](const TrainConfig& d, int world, int64_t accum) {
      Trainer dp(d);
      Trained got = train(dp);
      // Rank 0's one loader takes 16 x world rows per micro-batch: the single run's batch is
      // those of a step, in the same order.
      Trainer one(single_like(d, 16 * world * accum));
      Trained want = train(one);
      CHECK(max_abs_diff(dp.model(), one.model()) <= 1e-5);
      for (int r = 1; r < world; r++) CHECK_FALSE(dp.rank_model(r).owns_parameters());  // replicas are gone
      REQUIRE(got.steps.size() == want.steps.size());
      for (size_t s = 0; s < got.steps.size(); s++) {
        CAPTURE(s);
        CHECK(got.steps[s].samples == 16 * world * accum);
        CHECK(std::fabs(got.steps[s].loss - want.steps[s].loss) <= 1e-5);
        CHECK(got.steps[s].accuracy == doctest::Approx(want.steps[s].accuracy));
      }
      CHECK(got.summary.effective_batch == 16 * world * accum);
    });
  }

  TEST_CASE("one device: DataParallel calls the module itself, bit for bit the single run") {
    TrainConfig d = dp_config(1, 32, 8);
    Trainer dp(d);
    Trained got = train(dp);
    Trainer one(single_like(d, 32));
    Trained want = train(one);
    CHECK(max_abs_diff(dp.model(), one.model()) == 0);
    for (size_t s = 0; s < got.steps.size(); s++) CHECK(got.steps[s].loss == want.steps[s].loss);
  }

  TEST_CASE("every step broadcasts and reduces every parameter, and scatters and gathers the activations, 16-bit ones in half the bytes") {
   // A bf16 module (model.to(torch.bfloat16)) replicates, scatters, gathers and reduce-adds bf16
   // tensors: the same traffic at 2 bytes an element.
   for (Precision p : {Precision::FP32, Precision::BF16}) {
    const int64_t e = p == Precision::FP32 ? 4 : 2, S = kP * e;
    CAPTURE(e);
    for (int world : {2, 3, 4}) {
      CAPTURE(world);
      const int64_t B = 16, D = 2, C = 3;  // a piece: 16 rows of 2 inputs in, 16 rows of 3 logits out
      TrainConfig d = dp_config(world, B, 3);
      d.precision = p;
      Trainer t(d);
      t.run();
      const std::vector<Event> evs = t.recorder().all_events();
      for (int32_t it = 0; it < 3; it++) {
        CAPTURE(it);
        // Per rank: collectives run, bytes received in collective steps (by the receiver's events,
        // indexed by sender), point-to-point bytes sent and received.
        std::map<int, std::vector<const Event*>> bcast, reduce;
        std::vector<int64_t> sent(static_cast<size_t>(world), 0), received(static_cast<size_t>(world), 0);
        std::vector<int64_t> p2p_sends(static_cast<size_t>(world), 0), p2p_recvs(static_cast<size_t>(world), 0);
        int all_reduces = 0;
        for (const Event& e : evs) {
          if (e.iteration != it) continue;
          const size_t r = static_cast<size_t>(e.rank);
          if (e.kind == EventKind::Collective) {
            if (e.coll.op == CollectiveOp::Broadcast) bcast[e.rank].push_back(&e);
            if (e.coll.op == CollectiveOp::Reduce) reduce[e.rank].push_back(&e);
            if (e.coll.op == CollectiveOp::AllReduce) all_reduces++;
            if (e.coll.op == CollectiveOp::Send) sent[r] += e.coll.bytes, p2p_sends[r]++;
            if (e.coll.op == CollectiveOp::Recv) received[r] += e.coll.bytes, p2p_recvs[r]++;
          }
          if (e.kind == EventKind::RingStep && e.step.bytes > 0) {
            received[r] += e.step.bytes;
            sent[static_cast<size_t>(e.step.src)] += e.step.bytes;
          }
        }
        CHECK(all_reduces == 0);  // no all-reduce anywhere: DataParallel has no process group
        for (int r = 0; r < world; r++) {
          CAPTURE(r);
          // One broadcast (replicate) and one reduce (ReduceAddCoalesced) of S bytes, rooted at 0,
          // with PyTorch's copy path (naive: one copy per device).
          REQUIRE(bcast[r].size() == 1);
          REQUIRE(reduce[r].size() == 1);
          CHECK(bcast[r][0]->coll.bytes == S);
          CHECK(reduce[r][0]->coll.bytes == S);
          CHECK(bcast[r][0]->coll.root == 0);
          CHECK(reduce[r][0]->coll.root == 0);
          CHECK(bcast[r][0]->coll.algo == Algorithm::Naive);
          CHECK(reduce[r][0]->coll.algo == Algorithm::Naive);
        }
        const int64_t n1 = world - 1;
        // Rank 0: the broadcast to every other device, the input pieces (B x D floats) and the
        // output-gradient pieces (B x C floats) out; every gradient and output piece in.
        CHECK(sent[0] == n1 * (S + B * D * e + B * C * e));
        CHECK(received[0] == n1 * (S + B * C * e));
        CHECK(p2p_sends[0] == 2 * n1);
        CHECK(p2p_recvs[0] == n1);
        for (int r = 1; r < world; r++) {
          CAPTURE(r);
          CHECK(sent[static_cast<size_t>(r)] == S + B * C * e);            // its gradients, its output
          CHECK(received[static_cast<size_t>(r)] == S + B * D * e + B * C * e);  // the parameters, its pieces
          CHECK(p2p_sends[static_cast<size_t>(r)] == 1);
          CHECK(p2p_recvs[static_cast<size_t>(r)] == 2);
        }
        // Altogether: 2 (n-1) S for the parameters, as a ring all-reduce moves, plus the activations.
        int64_t total = 0;
        for (int64_t b : sent) total += b;
        CHECK(total == 2 * n1 * S + n1 * B * (D + 2 * C) * e);
      }
    }
   }
  }

  TEST_CASE("fp16 dp: the one process's GradScaler skips an overflowing step and halves the scale") {
    TrainConfig c = dp_config(3, 16, 5);
    c.precision = Precision::FP16;
    c.inject_overflow_steps = {2};
    c.inject_overflow_rank = 1;  // the loss is rank 0's whatever rank is named: it is one process's
    Trainer t(c);
    const TrainSummary s = t.run();
    REQUIRE(s.rank_skipped_steps.size() == 3);
    CHECK(s.rank_skipped_steps[0] == std::vector<int64_t>{2});
    CHECK(s.rank_skipped_steps[1].empty());  // the replicas hold no optimizer
    CHECK(s.loss_scale == 32768.0f);
    int steps = 0, decisions = 0;
    for (const Event& ev : t.recorder().events(0)) {
      steps += ev.kind == EventKind::Compute && ev.compute.kind == ComputeKind::OptimizerStep;
      decisions += ev.kind == EventKind::LossScale;
    }
    CHECK(steps == 4);
    CHECK(decisions == 5);
    // With no overflow the fp16 run meets one fp16 rank on the same batches (torch's fp16 tolerance;
    // plain SGD, whose update is linear in the gradient's rounding).
    TrainConfig plain = dp_config(3, 16, 5);
    plain.precision = Precision::FP16;
    plain.optimizer = default_optimizer_config(OptimizerKind::SGD);
    plain.optimizer.lr = 0.1;
    Trainer dp(plain);
    dp.run();
    Trainer one(single_like(plain, 48));
    one.run();
    const std::vector<float> a = dp.result_model().merged_params(), b = one.result_model().merged_params();
    REQUIRE(a.size() == b.size());
    size_t bad = 0;
    for (size_t i = 0; i < a.size(); i++) bad += std::fabs(a[i] - b[i]) > 1e-5 + 1e-3 * std::fabs(b[i]);
    CHECK(bad == 0);
  }

  TEST_CASE("the gradient reduce starts after the last replica's backward: no overlap") {
    TrainConfig d = dp_config(4, 16, 3);
    d.profile = "nvlink8";
    Trainer t(d);
    Trained got = train(t);
    for (const StepReport& r : got.steps) CHECK(r.overlap == 0.0);
    CHECK(got.summary.mean_overlap == 0.0);
    const std::vector<Event> evs = t.recorder().all_events();
    for (int32_t it = 0; it < 3; it++) {
      double last_backward = 0, reduce_begin = 1e30;
      for (const Event& e : evs) {
        if (e.iteration != it) continue;
        if (e.kind == EventKind::Compute && e.compute.kind == ComputeKind::LayerBackward)
          last_backward = std::max(last_backward, e.model_end);
        if (e.kind == EventKind::Collective && e.coll.op == CollectiveOp::Reduce) reduce_begin = std::min(reduce_begin, e.model_begin);
      }
      CHECK(reduce_begin >= last_backward);
    }
  }

  TEST_CASE("rank 0 holds the module, its gradients and the optimizer state, a replica nothing between steps") {
    const int64_t B = 16;
    for (OptimizerKind kind : {OptimizerKind::AdamW, OptimizerKind::SGD}) {
      CAPTURE(optimizer_name(kind));
      TrainConfig d = dp_config(3, B, 4);
      d.optimizer = default_optimizer_config(kind);
      d.optimizer.momentum = kind == OptimizerKind::SGD ? 0.9 : 0.0;
      Trainer t(d);
      TrainSummary s = t.run();
      REQUIRE(s.rank_memory.size() == 3);
      const MemoryStats& m0 = s.rank_memory[0];
      CHECK(m0.current_of(MemCategory::Parameters) == kS);
      CHECK(m0.current_of(MemCategory::Gradients) == kS);
      CHECK(m0.current_of(MemCategory::OptimizerState) == (kind == OptimizerKind::AdamW ? 2 : 1) * kS);
      CHECK(m0.current_of(MemCategory::CommBuffers) == 0);  // no buckets
      // Rank 0's activations: its replica's layers for its piece (16 x (64+64+64+64+3)), the two
      // gradient ping-pong buffers (16 x 64 each), and the whole batch's gathered logits, softmax
      // and logit gradients (48 x 3 each).
      const int64_t piece_acts = (B * (64 * 4 + 3) + 2 * B * 64) * 4;
      CHECK(m0.current_of(MemCategory::Activations) == piece_acts + 3 * (3 * B) * 3 * 4);
      for (int r = 1; r < 3; r++) {
        CAPTURE(r);
        const MemoryStats& m = s.rank_memory[static_cast<size_t>(r)];
        CHECK(m.current_of(MemCategory::Parameters) == 0);
        CHECK(m.current_of(MemCategory::Gradients) == 0);
        CHECK(m.current_of(MemCategory::OptimizerState) == 0);
        CHECK(m.peak_of(MemCategory::OptimizerState) == 0);
        // Inside the iteration the replica existed: parameters and gradients, then freed.
        CHECK(m.peak_of(MemCategory::Parameters) == kS);
        CHECK(m.peak_of(MemCategory::Gradients) == kS);
        // Its activations, plus the pieces rank 0 sent it (16 x 2 inputs, 16 x 3 output gradients).
        CHECK(m.current_of(MemCategory::Activations) == piece_acts + (B * 2 + B * 3) * 4);
      }
    }
  }

  // Issue 34: --lora-rank was refused with dp. torch's replicate() broadcasts every parameter of the
  // peft module, the frozen base included (flattened per coalesced group), and ReduceAddCoalesced
  // sums only the adapters' gradients, the only ones there are.
  TEST_CASE("dp with LoRA equals LoRA on one rank: replicate moves the frozen base, the reduce only the adapters") {
    const int64_t B = 16, r = 4;
    // Adapters of mlp:2,64,64,3 at rank 4: A (4, in) and B (out, 4) per Linear.
    const int64_t adapters = r * (2 + 64) + r * (64 + 64) + r * (64 + 3);
    for (int world : {2, 3}) {
      CAPTURE(world);
      TrainConfig d = dp_config(world, B, 6);
      d.lora.rank = r;
      Trainer dp(d);
      const Trained got = train(dp);
      Trainer one(single_like(d, B * world));
      const Trained want = train(one);
      const std::vector<float> a = dp.model().merged_params(), b = one.model().merged_params();
      REQUIRE(a.size() == static_cast<size_t>(kP));
      double worst = 0;
      for (size_t i = 0; i < a.size(); i++) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
      CHECK(worst <= 1e-5);
      for (size_t s = 0; s < got.steps.size(); s++) CHECK(std::fabs(got.steps[s].loss - want.steps[s].loss) <= 1e-5);
      // Iteration 0's collectives on rank 1: one broadcast of base + adapters, one reduce of the adapters.
      int64_t bcast = 0, reduce = 0;
      for (const Event& e : dp.recorder().events(1)) {
        if (e.kind != EventKind::Collective || e.iteration != 0) continue;
        if (e.coll.op == CollectiveOp::Broadcast) bcast += e.coll.bytes;
        if (e.coll.op == CollectiveOp::Reduce) reduce += e.coll.bytes;
      }
      CHECK(bcast == kS + adapters * 4);
      CHECK(reduce == adapters * 4);
      // A replica holds the base and the adapters while it exists, nothing after.
      const MemoryStats& m = got.summary.rank_memory[1];
      CHECK(m.current_of(MemCategory::Parameters) == 0);
      CHECK(m.peak_of(MemCategory::Parameters) == kS + adapters * 4);
      CHECK(m.peak_of(MemCategory::Gradients) == adapters * 4);
      CHECK(dp.model().lora());
    }
  }

  TEST_CASE("dp picks its device as ddp does: the GPUs when there are some, the CPU otherwise") {
    DeviceQuery q;
    q.strategy = Strategy::Dp;
    q.ranks_on_node = 4;
    q.gpus = 8;
    q.cuda_built = q.nccl_built = true;
    DeviceChoice c = resolve_device(q);
    CHECK(c.device == "cuda");
    CHECK(c.backend == "nccl");  // one device per replica, as torch's DataParallel over 4 of the 8 GPUs
    q.gpus = 1;
    c = resolve_device(q);
    CHECK(c.device == "cuda");
    CHECK(c.backend == "cuda");  // the replicas share the GPU
    q.gpus = 0;
    q.no_gpu_reason = "no CUDA device";
    c = resolve_device(q);
    CHECK(c.device == "cpu");
    CHECK(c.backend == "threads");
  }

  TEST_CASE("combinations that make no sense are one sentence, the CLI exits 2") {
    TrainConfig c = dp_config(2, 16, 1);
    c.skip_layer = 2;
    CHECK(error_of(c) == "--skip-layer with --strategy dp: it is DDP's unused-parameters lesson; drop it, or use --strategy ddp");
    c = dp_config(2, 16, 1);
    c.device = "cuda";
    c.backend = "cuda";
    CHECK(feature_refusal(c, Feature::Cuda).empty());  // DataParallel runs on GPUs (test_cuda.cpp follows it there)
    c = dp_config(2, 16, 1);
    c.backend = "socket";
    CHECK(error_of(c).find("so it cannot run one process per rank; use --strategy ddp under dtlab-cli launch") != std::string::npos);
    // Batches of 16 x 4 = 64: every full batch splits evenly; the last one of an epoch may not.
    c = dp_config(4, 16, 1);
    c.data = "spiral:points=335";  // 1005 samples, batches of 64: the last holds 45 (pieces of 12: 12, 12, 12, 9)
    CHECK(error_of(c).empty());
    c.data = "spiral:points=337";  // 1011 samples: the last batch holds 51 (13, 13, 13, 12)
    CHECK(error_of(c).empty());
    c.data = "spiral:points=323";  // 969 samples: the last batch holds 9 (3, 3, 3: three pieces for four devices)
    const std::string why = error_of(c);
    CHECK(why.find("the last batch of each epoch holds 9 of the 969 samples, which torch.chunk cuts into 3 pieces for 4 "
                   "devices, leaving one device without a replica") != std::string::npos);
    c.drop_last = true;
    CHECK(error_of(c).empty());

    auto usage = [](const std::vector<std::string>& args, const std::string& expect) {
      test::CliResult r = test::run_cli(args);
      INFO("stderr: ", r.err);
      CHECK(r.code == 2);
      CHECK(r.out.empty());
      CHECK(r.err.find('\n') == r.err.size() - 1);  // one line
      CHECK(r.err.find(expect) != std::string::npos);
    };
    usage({"train", "--strategy", "dp", "--world", "2", "--steps", "1", "--sharding", "full"}, "configures FSDP");
    usage({"train", "--strategy", "dp", "--world", "2", "--steps", "1", "--bucket-cap-mb", "1"}, "configures DDP");
    usage({"train", "--strategy", "dp", "--world", "2", "--steps", "1", "--skip-layer", "2"}, "--skip-layer with --strategy dp: it is DDP's unused-parameters lesson");
    usage({"train", "--strategy", "dp", "--world", "4", "--steps", "1", "--data", "spiral:points=323", "--batch", "16"},
          "without a replica");
  }

  TEST_CASE("dtlab-cli train --strategy dp prints what DataParallel does and what a replica holds") {
    test::CliResult r = test::run_cli({"train", "--strategy", "dp", "--world", "3", "--batch", "16", "--steps", "4",
                                       "--model", "mlp:2,64,64,3", "--device", "cpu"});
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("DataParallel: rank 0 loads batches of 48 and scatters 16 samples to each of the 3 devices") != std::string::npos);
    CHECK(r.out.find("overlap   0%") != std::string::npos);
    CHECK(r.out.find("memory (rank 1, a replica, peak of the last iteration):") != std::string::npos);
    CHECK(r.out.find("after it: ") != std::string::npos);
  }
}

#ifdef DTLAB_HAVE_GUI
#include <chrono>

#include "app/figures.h"
#include "app/session.h"

TEST_SUITE("data_parallel") {
  TEST_CASE("the lab: the ring view names DataParallel's collectives, the data view its pieces, the figures its bytes") {
    TrainConfig c = dp_config(4, 64, 5);  // batches of 256: 11 full ones and 184 rows (4 x 46), 750 samples a device
    c.model = ModelSpec::parse("mlp:2,64,64,3");
    c.start_paused = true;
    app::Session s(c);
    auto step = [&](GateKind k) -> const app::Snapshot& {
      REQUIRE(s.wait_settled(std::chrono::seconds(20)));
      s.step(k);
      REQUIRE(s.wait_settled(std::chrono::seconds(20)));
      return s.update();
    };
    // torch's DataParallel.forward scatters the inputs before it replicates the module: the stepper
    // stops at each send of the scatter (rank 0 to each replica), then at the broadcast.
    std::vector<std::string> stops;
    auto held_text = [&](const app::Snapshot& x) {
      const PendingItem& h = x.held;
      if (!h.valid) return std::string("none");
      if (h.gate.op.p2p)
        return "send " + std::to_string(h.gate.op.src) + "->" + std::to_string(h.gate.op.dst) + " " + std::to_string(h.gate.bytes) + " B";
      return std::string(collective_name(h.gate.coll));
    };
    const app::Snapshot* a = &step(GateKind::Collective);
    while (held_text(*a) != "broadcast" && stops.size() < 20) {
      stops.push_back(held_text(*a));
      a = &step(GateKind::Collective);
    }
    CHECK(stops == std::vector<std::string>{"send 0->1 512 B", "send 0->2 512 B", "send 0->3 512 B"});
    REQUIRE(a->collective.valid);
    CHECK(a->collective.op == CollectiveOp::Broadcast);
    CHECK(a->collective.label == "DataParallel replicate: every parameter from rank 0");
    // Rank 1's replica exists from the broadcast on.
    CHECK(a->memory[1].stats.current_of(MemCategory::Parameters) == kS);
    // Then the outputs gathered onto rank 0 (3 rows of logits each), their gradients scattered back,
    // and the ReduceAddCoalesced.
    stops.clear();
    const app::Snapshot* b = &step(GateKind::Collective);
    while (held_text(*b) != "reduce" && stops.size() < 20) {
      stops.push_back(held_text(*b));
      b = &step(GateKind::Collective);
    }
    CHECK(stops == std::vector<std::string>{"send 1->0 768 B", "send 2->0 768 B", "send 3->0 768 B", "send 0->1 768 B",
                                            "send 0->2 768 B", "send 0->3 768 B"});
    CHECK(b->collective.op == CollectiveOp::Reduce);
    CHECK(b->collective.label == "DataParallel backward: every gradient reduce-added onto rank 0");
    for (int r = 0; r < 4; r++) CHECK(std::count(b->data.owner.begin(), b->data.owner.end(), r) == 750);
    const app::Snapshot& d = step(GateKind::Iteration);  // iteration 0 done
    CHECK(d.memory[1].stats.current_of(MemCategory::Parameters) == 0);
    // The figures the lesson reads: bytes per rank in the last finished iteration, collectives counted.
    auto fig = [&](const std::string& f) { return app::Figure::parse(f).eval({&d, nullptr}); };
    const int64_t in = 64 * 2 * 4, out = 64 * 3 * 4;  // one piece of the input, of the logits
    CHECK(fig("traffic.sent_by(0)") == 3 * (kS + in + out));
    CHECK(fig("traffic.sent_by(2)") == kS + out);
    CHECK(fig("traffic.received_by(0)") == 3 * (kS + out));
    CHECK(fig("traffic.received_by(3)") == kS + in + out);
    CHECK(fig("traffic.total") == 2 * 3 * kS + 3 * (in + 2 * out));
    CHECK(fig("count.collectives(0, \"broadcast\")") == 1);
    CHECK(fig("count.collectives(0, \"reduce\")") == 1);
    CHECK(fig("count.collectives(0, \"allreduce\")") == 0);
  }
}
#endif
