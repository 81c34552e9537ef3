// Mixed precision (--precision bf16/fp16; issue 17; docs/course_sources.md §6e): the memory layout
// behind 2 + 2 + 12 bytes per parameter, 16-bit GEMMs that accumulate in float32 and round once, DDP's
// buckets in the training dtype (or float32), the spiral demo's accuracy, and fp16's GradScaler: an
// overflow on one rank skips exactly that step on every rank and halves the scale. FSDP (suite "fsdp"):
// fp32 shards, 16-bit all-gathers and reduce-scatters (float32 with --reduce-dtype fp32), torch's
// ShardedGradScaler.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/core/half.h"
#include "engine/core/model.h"
#include "engine/trace/export.h"
#include "engine/train/compose.h"
#include "engine/train/grad_scaler.h"
#include "engine/train/train.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

TrainConfig mixed(const std::string& strategy, int world, Precision p, int64_t steps, int64_t batch = 32) {
  TrainConfig c = test::demo_config(strategy, world, batch, steps);
  c.precision = p;
  return c;
}

// Bytes one rank's bucket all-reduces moved in iteration `it`, and the dtype they moved.
int64_t bucket_bytes(Trainer& t, int rank, int it, DType& dtype) {
  std::vector<uint64_t> seqs;
  for (const Event& e : t.recorder().events(rank))
    if (e.kind == EventKind::BucketLaunch && e.iteration == it) seqs.push_back(e.bucket.seq);
  int64_t moved = 0;
  for (const Event& e : t.recorder().events(rank)) {
    if (e.kind != EventKind::Collective || e.iteration != it) continue;
    if (std::find(seqs.begin(), seqs.end(), e.coll.seq) == seqs.end()) continue;
    moved += e.coll.bytes;
    dtype = e.coll.dtype;
  }
  return moved;
}

// torch.testing.assert_close's default tolerances for a dtype (bfloat16 rtol 1.6e-2, float16 1e-3; atol
// 1e-5): the worst |a - b| - (atol + rtol |b|) over the parameters, <= 0 when they are close.
double excess_over_tolerance(const std::vector<float>& a, const std::vector<float>& b, Precision p) {
  REQUIRE(a.size() == b.size());
  const double rtol = p == Precision::BF16 ? 1.6e-2 : 1e-3, atol = 1e-5;
  double worst = -1;
  for (size_t i = 0; i < a.size(); i++)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]) - (atol + rtol * std::fabs(static_cast<double>(b[i]))));
  return worst;
}

// SGD with momentum at lr 0.01: its update is linear in the gradient, so a rounding difference in a
// gradient stays rounding-sized (AdamW's normalised step can turn it into a whole lr step).
void use_sgd_momentum(TrainConfig& c) {
  c.optimizer = default_optimizer_config(OptimizerKind::SGD);
  c.optimizer.lr = 0.01;
  c.optimizer.momentum = 0.9;
}

// Rank 0's parameters after running `c` (the reference runs).
std::vector<float> params_after(const TrainConfig& c) {
  Trainer t(c);
  t.run();
  return t.rank_model(0).host_params();
}

// Bytes and dtype of one rank's collectives of kind `op` in iteration `it` (each counted once, by its
// sequence number).
int64_t collective_bytes(Trainer& t, int rank, int it, CollectiveOp op, DType& dtype) {
  int64_t moved = 0;
  std::vector<uint64_t> seen;
  for (const Event& e : t.recorder().events(rank)) {
    if (e.kind != EventKind::Collective || e.iteration != it || e.coll.op != op) continue;
    if (std::find(seen.begin(), seen.end(), e.coll.seq) != seen.end()) continue;
    seen.push_back(e.coll.seq);
    moved += e.coll.bytes;
    dtype = e.coll.dtype;
  }
  return moved;
}

}  // namespace

// In the ddp suite: CI runs it under ThreadSanitizer (16-bit buckets, the found-inf all-reduce).
TEST_CASE("bf16 DDP with AdamW: every rank holds 2 + 2 + 4 + 8 bytes per parameter" * doctest::test_suite("ddp")) {
  for (const bool fp32_reduce : {false, true}) {
    CAPTURE(fp32_reduce);
    TrainConfig c = mixed("ddp", 2, Precision::BF16, 4);
    c.reduce_fp32 = fp32_reduce;
    Trainer t(c);
    const TrainSummary s = t.run();
    const int64_t P = c.model.num_params();
    REQUIRE(s.rank_memory.size() == 2);
    for (int r = 0; r < 2; r++) {
      CAPTURE(r);
      const MemoryStats& m = s.rank_memory[static_cast<size_t>(r)];
      CHECK(m.current_of(MemCategory::Parameters) == 2 * P);
      CHECK(m.current_of(MemCategory::Gradients) == 2 * P);
      CHECK(m.current_of(MemCategory::MasterWeights) == 4 * P);
      CHECK(m.current_of(MemCategory::OptimizerState) == 8 * P);
      // The buckets: 16-bit gradients in the training dtype, or float32 for --reduce-dtype fp32.
      CHECK(m.current_of(MemCategory::CommBuffers) == (fp32_reduce ? 4 : 2) * P);
      DType dt = DType::I64;
      CHECK(bucket_bytes(t, r, 2, dt) == (fp32_reduce ? 4 : 2) * P);
      CHECK(dt == (fp32_reduce ? DType::F32 : DType::BF16));
    }
    // DDP keeps the replicas equal: the same 16-bit parameters on both ranks.
    CHECK(t.rank_model(0).host_params() == t.rank_model(1).host_params());
  }
}

// --precision with --gradient-as-bucket-view (issue 34): the buckets are in the gradients' 16-bit
// dtype and each grad16 is its bucket's view (rebound again when the buckets are rebuilt after the
// first step), so the run equals the plain 16-bit DDP run bit for bit, and the model's own 16-bit
// gradient buffer is gone: 2 bytes a parameter less on every rank.
TEST_CASE("bf16 and fp16 DDP with --gradient-as-bucket-view: bit for bit the plain run, no gradient buffer" * doctest::test_suite("ddp")) {
  for (const Precision p : {Precision::BF16, Precision::FP16}) {
    CAPTURE(precision_name(p));
    TrainConfig c = mixed("ddp", 2, p, 3);
    Trainer plain(c);
    const TrainSummary a = plain.run();
    c.ddp.gradient_as_bucket_view = true;
    Trainer view(c);
    const TrainSummary b = view.run();
    const int64_t P = c.model.num_params();
    for (int r = 0; r < 2; r++) {
      CAPTURE(r);
      CHECK(view.rank_model(r).host_params() == plain.rank_model(r).host_params());
      CHECK(view.rank_model(r).grads16() == nullptr);
      const MemoryStats& m = b.rank_memory[static_cast<size_t>(r)];
      CHECK(a.rank_memory[static_cast<size_t>(r)].current_of(MemCategory::Gradients) == 2 * P);
      CHECK(m.current_of(MemCategory::Gradients) == 0);
      CHECK(m.current_of(MemCategory::CommBuffers) == 2 * P);  // the buckets, which are the gradients
    }
  }
  TrainConfig c = mixed("ddp", 2, Precision::BF16, 2);
  c.ddp.gradient_as_bucket_view = true;
  c.reduce_fp32 = true;
  CHECK(test::error_of(c) == "--gradient-as-bucket-view with --reduce-dtype fp32: each 16-bit gradient would be a view of a float32 "
                             "bucket; drop one of them");
}

TEST_CASE("a 16-bit Linear widens its operands, accumulates in float32 and rounds its output once") {
  for (const Precision p : {Precision::BF16, Precision::FP16}) {
    const std::string name = precision_name(p);
    CAPTURE(name);
    const HalfFormat f = half_format_of(p);
    const ModelSpec spec = ModelSpec::parse("mlp:5,16,16,3");
    Model fp32(spec, nullptr, 7);
    const std::vector<float> w32 = fp32.host_params();
    Model m(spec, nullptr, 7);
    m.set_precision(p);
    const std::vector<float> w = m.host_params();
    for (size_t k = 0; k < w.size(); k++) REQUIRE(w[k] == round_to_half(w32[k], f));  // model.to(dtype)
    const int64_t B = 9;
    std::vector<float> x(static_cast<size_t>(B * 5));
    for (size_t k = 0; k < x.size(); k++) x[k] = std::sin(0.7f * static_cast<float>(k)) * 3.0f;
    const float* logits = m.forward(x.data(), B);
    // The reference in double from the rounded values, rounded once per Linear, as the model rounds.
    std::vector<float> in(x.size());
    for (size_t k = 0; k < x.size(); k++) in[k] = round_to_half(x[k], f);
    int64_t width = 5;
    for (const Parameter* prm = &m.parameters()[0]; prm <= &m.parameters().back(); prm += 2) {
      const int64_t out_w = prm->shape[0];
      std::vector<float> y(static_cast<size_t>(B * out_w));
      for (int64_t b = 0; b < B; b++)
        for (int64_t o = 0; o < out_w; o++) {
          double acc = w[static_cast<size_t>(prm[1].offset + o)];
          for (int64_t i = 0; i < width; i++)
            acc += static_cast<double>(in[static_cast<size_t>(b * width + i)]) * w[static_cast<size_t>(prm->offset + o * width + i)];
          float v = round_to_half(static_cast<float>(acc), f);
          if (prm != &m.parameters().back() - 1 && v < 0) v = 0;  // the ReLU after every Linear but the last
          y[static_cast<size_t>(b * out_w + o)] = v;
        }
      in = y;
      width = out_w;
    }
    // float32 accumulation in the GEMM's order against double: equal, or one 16-bit step apart where
    // the float32 sum lies within its rounding of a tie.
    int off_by_one = 0;
    for (size_t k = 0; k < in.size(); k++) {
      const float ulp = std::fabs(round_to_half(in[k], f)) * (f == HalfFormat::BF16 ? 1.0f / 128 : 1.0f / 1024);
      CHECK(std::fabs(logits[k] - in[k]) <= ulp);
      off_by_one += logits[k] != in[k];
      CHECK(logits[k] == round_to_half(logits[k], f));  // every logit is a 16-bit value
    }
    CHECK(off_by_one <= 1);
  }
}

TEST_CASE("bf16 and fp16 train the spiral demo to at least 95% accuracy") {
  for (const Precision p : {Precision::BF16, Precision::FP16}) {
    for (const std::string strategy : {"single", "ddp", "fsdp"}) {
      const std::string name = precision_name(p);
      CAPTURE(name);
      CAPTURE(strategy);
      TrainConfig c = mixed(strategy, strategy == "single" ? 1 : 2, p, 400, strategy == "single" ? 64 : 32);
      const TrainSummary s = Trainer(c).run();
      MESSAGE(name << " " << strategy << ": accuracy " << s.eval_accuracy << ", loss " << s.eval_loss);
      CHECK(s.eval_accuracy >= 0.95);
      if (p == Precision::FP16) {
        CHECK(s.loss_scale == 65536.0f);  // no overflow in 400 steps, no growth before 2000
        for (const auto& r : s.rank_skipped_steps) CHECK(r.empty());
      }
    }
  }
}

// In the ddp suite: CI runs it under ThreadSanitizer (16-bit buckets, the found-inf all-reduce).
TEST_CASE("fp16: an overflow on one rank skips exactly that step on every rank and halves the scale" * doctest::test_suite("ddp")) {
  for (const int world : {2, 4}) {
    CAPTURE(world);
    TrainConfig c = mixed("ddp", world, Precision::FP16, 9);
    c.inject_overflow_steps = {3, 7, 8};
    c.inject_overflow_rank = world - 1;
    Trainer t(c);
    const TrainSummary s = t.run();
    REQUIRE(s.rank_skipped_steps.size() == static_cast<size_t>(world));
    for (const auto& r : s.rank_skipped_steps) CHECK(r == std::vector<int64_t>{3, 7, 8});
    CHECK(s.loss_scale == 65536.0f / 8);
    for (int rank = 0; rank < world; rank++) {
      CAPTURE(rank);
      std::vector<float> scales;
      std::vector<int> skipped_iters;
      int optimizer_steps = 0;
      for (const Event& e : t.recorder().events(rank)) {
        if (e.kind == EventKind::LossScale) {
          scales.push_back(e.scaler.scale);
          if (e.scaler.skipped) skipped_iters.push_back(e.iteration);
          if (rank == world - 1 && e.scaler.skipped) CHECK(e.scaler.found_inf == 1);  // its own overflow
        }
        if (e.kind == EventKind::Compute && e.compute.kind == ComputeKind::OptimizerStep) optimizer_steps++;
      }
      CHECK(skipped_iters == std::vector<int>{2, 6, 7});
      CHECK(scales == std::vector<float>{65536, 65536, 65536, 32768, 32768, 32768, 32768, 16384, 8192});
      CHECK(optimizer_steps == 6);
      // The Chrome trace: the decisions as instants, the buckets' all-reduces in torch's "Half".
      const std::string trace = chrome_trace_json(t.recorder().events(rank));
      int skipped_instants = 0;
      for (size_t at = trace.find("\"step skipped (inf/NaN)\""); at != std::string::npos; at = trace.find("\"step skipped (inf/NaN)\"", at + 1))
        skipped_instants++;
      CHECK(skipped_instants == 3);
      CHECK(trace.find("\"dtype\":\"Half\"") != std::string::npos);
    }
  }
}

TEST_CASE("fp16: a skipped step leaves the weights and the optimizer as they were") {
  TrainConfig a = mixed("ddp", 2, Precision::FP16, 4);
  a.inject_overflow_steps = {3, 4};
  TrainConfig b = mixed("ddp", 2, Precision::FP16, 2);
  Trainer ta(a), tb(b);
  ta.run();
  tb.run();
  CHECK(ta.rank_model(0).host_params() == tb.rank_model(0).host_params());
  CHECK(ta.rank_model(1).host_params() == tb.rank_model(1).host_params());
}

TEST_CASE("GradScaler: torch's update rules (backoff 0.5 at once, growth 2 after 2000 clean steps)") {
  GradScaler s;
  CHECK(s.scale() == 65536.0f);
  for (int i = 0; i < 1999; i++) s.update(false);
  CHECK(s.scale() == 65536.0f);
  CHECK(s.growth_tracker() == 1999);
  s.update(false);
  CHECK(s.scale() == 131072.0f);
  CHECK(s.growth_tracker() == 0);
  s.update(false);
  s.update(true);
  CHECK(s.scale() == 65536.0f);
  CHECK(s.growth_tracker() == 0);
  CHECK(s.inv_scale() == 1.0f / 65536.0f);
}

TEST_CASE("mixed precision refuses what it does not run with, in one sentence") {
  // Every strategy runs in 16 bits on a GPU too (tests/test_cuda.cpp follows the CPU engine there),
  // and under dtlab-cli launch on the CPU.
  TrainConfig c = mixed("ddp", 2, Precision::FP16, 2);
  for (Strategy s : {Strategy::Single, Strategy::Ddp, Strategy::Dp, Strategy::Fsdp, Strategy::Pipeline}) {
    c.strategy = s;
    c.device = "cuda";
    CHECK(feature_refusal(c, Feature::MixedPrecision).empty());
  }
  c.strategy = Strategy::Ddp;
  c.device = "cpu";
  c.launched = true;
  CHECK(feature_refusal(c, Feature::MixedPrecision).empty());
  c = mixed("ddp", 2, Precision::BF16, 2);
  c.inject_overflow_steps = {1};
  CHECK(test::error_of(c) == "--inject-overflow makes fp16 gradients overflow (bf16 has float32's range); use --precision fp16");
  c = mixed("ddp", 2, Precision::FP16, 2);
  c.inject_overflow_steps = {1};
  c.inject_overflow_rank = 2;
  CHECK(test::error_of(c) == "--inject-overflow-rank 2 is not a rank of this run; pick 0 to 1");
  // A step the run never reaches was accepted and never fired.
  c = mixed("ddp", 2, Precision::FP16, 2);
  c.inject_overflow_steps = {0};
  CHECK(test::error_of(c) == "--inject-overflow 0 names no step: steps count from 1, so it would never fire; use 1 to the run's last step");
  c.inject_overflow_steps = {2, 3};
  CHECK(test::error_of(c) == "--inject-overflow 3 is after the run's last step (2), so it would never fire; pick steps 1 to 2");
  c = mixed("ddp", 2, Precision::FP32, 2);
  c.reduce_fp32 = true;
  CHECK(test::error_of(c) == "--reduce-dtype fp32 applies to 16-bit gradients; add --precision bf16 or fp16");
  CHECK_THROWS_WITH(parse_precision("fp8"), "precision 'fp8' is not known; use fp32, bf16 or fp16");
}

// FSDP with torch's MixedPrecision(param_dtype=bf16): fp32 shards stepped by the optimizer, 16-bit
// compute, 16-bit reductions. DDP's bf16 run differs only in how the gradient sums round (and, on 4
// ranks, in their order), so after 3 steps the two agree within torch.testing's bfloat16 tolerance.
TEST_CASE("bf16 FSDP equals bf16 DDP within torch's bf16 tolerance, FULL_SHARD and SHARD_GRAD_OP" * doctest::test_suite("fsdp")) {
  for (const int world : {2, 4}) {
    Trainer ddp(mixed("ddp", world, Precision::BF16, 3));
    ddp.run();
    const std::vector<float> want = ddp.rank_model(0).host_params();
    for (const Sharding sh : {Sharding::FullShard, Sharding::ShardGradOp}) {
      CAPTURE(world);
      CAPTURE(sharding_name(sh));
      TrainConfig c = mixed("fsdp", world, Precision::BF16, 3);
      c.fsdp.sharding = sh;
      Trainer t(c);
      const TrainSummary s = t.run();
      for (int r = 0; r < world; r++) {
        CAPTURE(r);
        CHECK(t.rank_model(r).precision() == Precision::BF16);
        CHECK(excess_over_tolerance(t.rank_model(r).host_params(), want, Precision::BF16) <= 0);
        // On 2 ranks FSDP1's pre-divide is DDP's 1/2 and each sum is one rounded addition: bit-identical.
        if (world == 2) CHECK(t.rank_model(r).host_params() == want);
      }
      if (world != 4) continue;
      // What a rank keeps: the fp32 shard (the master, chunks of 48, 1040 and 49 on 4 ranks), its fp32
      // gradient and AdamW's two moments; the 16-bit parameters only while gathered (2 bytes each).
      const int64_t shard = 48 + 1040 + 49;
      const MemoryStats& m = s.rank_memory[1];
      CHECK(m.current_of(MemCategory::Parameters) == 0);
      CHECK(m.current_of(MemCategory::MasterWeights) == 4 * shard);
      CHECK(m.current_of(MemCategory::Gradients) == 4 * shard);
      CHECK(m.current_of(MemCategory::OptimizerState) == 8 * shard);
      CHECK(m.current_of(MemCategory::GatheredParameters) == 0);
      if (sh == Sharding::FullShard) CHECK(m.peak_of(MemCategory::GatheredParameters) == (196 + 4160) * 2);
      else CHECK(m.peak_of(MemCategory::GatheredParameters) == (192 + 4160 + 196) * 2);
    }
  }
}

// Gradient accumulation in bf16: FSDP reduces each micro-batch's 16-bit gradient (reduce-scatter, or
// NO_SHARD's and ZeRO-1's all-reduce) and adds the reduced shards in float32 (the shard's dtype, as
// torch's FSDP does); DDP adds the 16-bit
// .grad of each micro-batch and all-reduces the sum once. Both stay within torch's bf16 tolerance.
// SGD with momentum at lr 0.01: AdamW's normalised step would turn a near-zero gradient's rounding
// difference into a whole lr step (0.008 here), and at lr 0.1 DDP's 16-bit sum of the micro-batches
// (one more bf16 rounding of the gradient) moves small weights by a bf16 ulp beyond the tolerance;
// a lost micro-batch moves them by 6e-4 beyond it (tried).
TEST_CASE("bf16 FSDP with --accum equals bf16 DDP with it within torch's bf16 tolerance, every sharding" * doctest::test_suite("fsdp")) {
  for (const int world : {2, 4}) {
    TrainConfig d = mixed("ddp", world, Precision::BF16, 3, 16);
    d.accum = 2;
    use_sgd_momentum(d);
    const std::vector<float> want = params_after(d);
    for (const Sharding sh : {Sharding::FullShard, Sharding::ShardGradOp, Sharding::NoShard, Sharding::Zero1, Sharding::Hybrid}) {
      CAPTURE(world);
      const std::string sharding = sharding_name(sh);
      CAPTURE(sharding);
      TrainConfig c = d;
      c.strategy = Strategy::Fsdp;
      c.fsdp.sharding = sh;
      if (sh == Sharding::Hybrid) c.fsdp.node_size = world / 2;
      Trainer t(c);
      t.run();
      for (int r = 0; r < world; r++) CHECK(excess_over_tolerance(t.rank_model(r).host_params(), want, Precision::BF16) <= 0);
    }
  }
}

// The all-gathers move the param dtype, the reduce-scatters the reduce dtype: 16-bit halves fp32's bytes.
TEST_CASE("bf16 FSDP all-gathers and reduce-scatters half of fp32's bytes, and with --reduce-dtype fp32 reduce-scatters fp32's" * doctest::test_suite("fsdp")) {
  struct Run {
    Precision precision;
    bool reduce_fp32;
    int64_t gather_elem, reduce_elem;  // bytes per element moved
    DType gather_dtype, reduce_dtype;
  };
  // 4 ranks: three units padded to 192 + 4160 + 196 = 4548 elements; FULL_SHARD gathers each twice.
  const int64_t padded = 192 + 4160 + 196;
  for (const Run& want : {Run{Precision::FP32, false, 4, 4, DType::F32, DType::F32},
                          Run{Precision::BF16, false, 2, 2, DType::BF16, DType::BF16},
                          Run{Precision::BF16, true, 2, 4, DType::BF16, DType::F32}}) {
    CAPTURE(precision_name(want.precision));
    CAPTURE(want.reduce_fp32);
    TrainConfig c = mixed("fsdp", 4, want.precision, 3);  // iteration 1: the last one also holds materialize()'s gathers
    c.reduce_fp32 = want.reduce_fp32;
    Trainer t(c);
    t.run();
    for (int r = 0; r < 4; r++) {
      CAPTURE(r);
      DType ag = DType::I64, rs = DType::I64;
      CHECK(collective_bytes(t, r, 1, CollectiveOp::AllGather, ag) == 2 * padded * want.gather_elem);
      CHECK(collective_bytes(t, r, 1, CollectiveOp::ReduceScatter, rs) == padded * want.reduce_elem);
      CHECK(ag == want.gather_dtype);
      CHECK(rs == want.reduce_dtype);
    }
  }
}

// torch's ShardedGradScaler: each rank checks its own gradient shard, the found-inf all-reduce makes the
// decision the world's. The injected overflow reaches every shard here, so every rank finds it.
TEST_CASE("fp16 FSDP: an overflow on one rank skips exactly that step on every rank and halves the scale" * doctest::test_suite("fsdp")) {
  for (const bool fp32_reduce : {false, true}) {
    CAPTURE(fp32_reduce);
    TrainConfig c = mixed("fsdp", 4, Precision::FP16, 9);
    c.inject_overflow_steps = {3, 7, 8};
    c.inject_overflow_rank = 3;
    c.reduce_fp32 = fp32_reduce;
    Trainer t(c);
    const TrainSummary s = t.run();
    REQUIRE(s.rank_skipped_steps.size() == 4);
    for (const auto& r : s.rank_skipped_steps) CHECK(r == std::vector<int64_t>{3, 7, 8});
    CHECK(s.loss_scale == 65536.0f / 8);
    for (int rank = 0; rank < 4; rank++) {
      CAPTURE(rank);
      std::vector<float> scales;
      std::vector<int> skipped_iters, found_iters;
      int optimizer_steps = 0;
      for (const Event& e : t.recorder().events(rank)) {
        if (e.kind == EventKind::LossScale) {
          scales.push_back(e.scaler.scale);
          if (e.scaler.skipped) skipped_iters.push_back(e.iteration);
          if (e.scaler.found_inf) found_iters.push_back(e.iteration);
        }
        if (e.kind == EventKind::Compute && e.compute.kind == ComputeKind::OptimizerStep) optimizer_steps++;
      }
      CHECK(skipped_iters == std::vector<int>{2, 6, 7});
      CHECK(found_iters == skipped_iters);
      CHECK(scales == std::vector<float>{65536, 65536, 65536, 32768, 32768, 32768, 32768, 16384, 8192});
      CHECK(optimizer_steps == 6);
    }
  }
}

TEST_CASE("fp16 FSDP: a skipped step leaves the weights and the optimizer as they were" * doctest::test_suite("fsdp")) {
  TrainConfig a = mixed("fsdp", 2, Precision::FP16, 4);
  a.inject_overflow_steps = {3, 4};
  Trainer ta(a), tb(mixed("fsdp", 2, Precision::FP16, 2));
  ta.run();
  tb.run();
  CHECK(ta.rank_model(0).host_params() == tb.rank_model(0).host_params());
  CHECK(ta.rank_model(1).host_params() == tb.rank_model(1).host_params());
}

// The other shardings under torch's MixedPrecision(param_dtype): NO_SHARD all-reduces each unit's 16-bit
// gradient and steps the whole fp32 master, ZeRO-1 the same with the master, gradient and optimizer
// state of its slice only, HYBRID_SHARD reduce-scatters in the node group and all-reduces across the
// replicas. On 2 ranks each sum is one rounded addition, with DDP's 1/2 before it: bit for bit DDP's
// run; on 4 ranks the sums add in another order (units, not buckets; two groups), so within torch's
// tolerance for the dtype. HYBRID_SHARD on 4 ranks adds (a + b) + (c + d), each rounded to bf16, where
// DDP's ring adds one rank at a time: under AdamW a near-zero gradient whose rounding flips its sign
// moves a weight by a whole lr step (0.0039 beyond bf16's tolerance, tried), so it compares with SGD
// and momentum, whose update is linear in the gradient (as the --accum test above).
TEST_CASE("bf16 and fp16 FSDP NO_SHARD, ZeRO-1 and HYBRID_SHARD equal DDP within torch's tolerance" * doctest::test_suite("fsdp")) {
  for (const Precision p : {Precision::BF16, Precision::FP16})
    for (const int world : {2, 4})
      for (const Sharding sh : {Sharding::NoShard, Sharding::Zero1, Sharding::Hybrid}) {
        const std::string run = std::string(precision_name(p)) + " " + sharding_name(sh) + " on " + std::to_string(world);
        CAPTURE(run);
        TrainConfig d = mixed("ddp", world, p, 3);
        if (sh == Sharding::Hybrid && world == 4) use_sgd_momentum(d);
        const std::vector<float> want = params_after(d);
        TrainConfig c = d;
        c.strategy = Strategy::Fsdp;
        c.fsdp.sharding = sh;
        if (sh == Sharding::Hybrid) c.fsdp.node_size = world / 2;
        Trainer t(c);
        const TrainSummary s = t.run();
        for (int r = 0; r < world; r++) {
          CAPTURE(r);
          CHECK(t.rank_model(r).precision() == p);
          CHECK(excess_over_tolerance(t.rank_model(r).host_params(), want, p) <= 0);
          if (world == 2) CHECK(t.rank_model(r).host_params() == want);
        }
        if (world != 4 || sh == Sharding::Hybrid) continue;
        // The model's 16-bit parameters and gradients stay whole; the fp32 master, its gradient and
        // AdamW's moments are all of it (NO_SHARD) or the rank's ZeRO-1 slice of ceil(4547 / 4).
        const int64_t P = c.model.num_params(), owned = sh == Sharding::NoShard ? P : 1137;
        const MemoryStats& m = s.rank_memory[1];
        CHECK(m.current_of(MemCategory::Parameters) == 2 * P);
        CHECK(m.current_of(MemCategory::MasterWeights) == 4 * owned);
        CHECK(m.current_of(MemCategory::Gradients) == 2 * P + 4 * owned);
        CHECK(m.current_of(MemCategory::OptimizerState) == 8 * owned);
      }
}

// What moves, per dtype, in iteration 1 (of 3: the last one also holds materialize()'s gathers).
// Each collective counted once, by its group and sequence number.
int64_t bytes_of(Trainer& t, int rank, CollectiveOp op, DType dt) {
  int64_t moved = 0;
  std::vector<std::pair<int32_t, uint64_t>> seen;
  for (const Event& e : t.recorder().events(rank)) {
    if (e.kind != EventKind::Collective || e.iteration != 1 || e.coll.op != op || e.coll.dtype != dt) continue;
    const std::pair<int32_t, uint64_t> id{e.coll.group, e.coll.seq};
    if (std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
    seen.push_back(id);
    moved += e.coll.bytes;
  }
  return moved;
}

// torch moves the param dtype in its all-gathers and the reduce dtype in its gradient reductions: 2
// bytes per element for bf16 (4 with --reduce-dtype fp32, whose reductions then move no 16-bit byte).
TEST_CASE("bf16 FSDP NO_SHARD, ZeRO-1 and HYBRID_SHARD move 2 bytes per element where torch does" * doctest::test_suite("fsdp")) {
  // 4 ranks, P = 192 + 4160 + 195 parameters in three units; ZeRO-1's flat split pads P to 4 x 1137;
  // HYBRID_SHARD's node groups of 2 pad the units to 192 + 4160 + 196 and hold halves of them.
  const int64_t P = 4547;
  for (const bool fp32_reduce : {false, true})
    for (const Sharding sh : {Sharding::NoShard, Sharding::Zero1, Sharding::Hybrid}) {
      CAPTURE(fp32_reduce);
      const std::string sharding = sharding_name(sh);
      CAPTURE(sharding);
      TrainConfig c = mixed("fsdp", 4, Precision::BF16, 3);
      c.fsdp.sharding = sh;
      c.reduce_fp32 = fp32_reduce;
      if (sh == Sharding::Hybrid) c.fsdp.node_size = 2;
      Trainer t(c);
      t.run();
      const int64_t red = fp32_reduce ? 4 : 2;  // bytes per reduced element
      const DType rdt = fp32_reduce ? DType::F32 : DType::BF16, other = fp32_reduce ? DType::BF16 : DType::F32;
      for (int r = 0; r < 4; r++) {
        CAPTURE(r);
        if (sh == Sharding::Hybrid) {
          const int64_t padded = 192 + 4160 + 196;
          CHECK(bytes_of(t, r, CollectiveOp::AllGather, DType::BF16) == 2 * padded * 2);  // before forward and backward
          CHECK(bytes_of(t, r, CollectiveOp::ReduceScatter, rdt) == padded * red);
          CHECK(bytes_of(t, r, CollectiveOp::ReduceScatter, other) == 0);
          CHECK(bytes_of(t, r, CollectiveOp::AllReduce, rdt) == padded / 2 * red + (fp32_reduce ? 16 : 0));  // + the step's 4 figures
          continue;
        }
        CHECK(bytes_of(t, r, CollectiveOp::AllReduce, rdt) == P * red + (fp32_reduce ? 16 : 0));
        CHECK(bytes_of(t, r, CollectiveOp::AllReduce, DType::BF16) == (fp32_reduce ? 0 : P * 2));
        CHECK(bytes_of(t, r, CollectiveOp::AllGather, DType::BF16) == (sh == Sharding::Zero1 ? 4 * 1137 * 2 : 0));
        CHECK(bytes_of(t, r, CollectiveOp::AllGather, DType::F32) == 0);
      }
    }
}

// ShardedGradScaler in each of them: the rank checks the fp32 gradient it steps (NO_SHARD all of it,
// ZeRO-1 its slice, HYBRID_SHARD its node shard) and the found-inf all-reduce makes every rank skip.
TEST_CASE("fp16 FSDP NO_SHARD, ZeRO-1 and HYBRID_SHARD: an overflow on one rank skips that step on every rank" * doctest::test_suite("fsdp")) {
  for (const Sharding sh : {Sharding::NoShard, Sharding::Zero1, Sharding::Hybrid}) {
    const std::string sharding = sharding_name(sh);
    CAPTURE(sharding);
    TrainConfig c = mixed("fsdp", 4, Precision::FP16, 4);
    c.fsdp.sharding = sh;
    if (sh == Sharding::Hybrid) c.fsdp.node_size = 2;
    c.inject_overflow_steps = {2};
    c.inject_overflow_rank = 3;
    Trainer t(c);
    const TrainSummary s = t.run();
    REQUIRE(s.rank_skipped_steps.size() == 4);
    for (const auto& r : s.rank_skipped_steps) CHECK(r == std::vector<int64_t>{2});
    CHECK(s.loss_scale == 32768.0f);
    // The skipped step left every replica where the others are.
    for (int r = 1; r < 4; r++) CHECK(t.rank_model(r).host_params() == t.rank_model(0).host_params());
  }
}

// --amp (issue 37, item 1): torch.autocast's layout beside --precision's. tests/amp_torch.py holds its
// values to torch.autocast(bf16) on the CPU; here the layout, the bytes, the loss curve and the scaler.
TEST_CASE("--amp: float32 parameters, gradients and state, 16-bit activations, DDP and FSDP reduce float32, the spiral trains as in fp32" *
          doctest::test_suite("ddp")) {
  // Memory: 4 + 4 + 8 bytes per parameter (AdamW) and no master copy, against --precision's 2 + 2 + 4 + 8;
  // the activations in 2 bytes, half of fp32's.
  TrainConfig f32 = test::demo_config("ddp", 2, 32, 4);
  TrainConfig amp = f32;
  amp.amp = Precision::BF16;
  Trainer t32(f32), tamp(amp);
  const TrainSummary s32 = t32.run(), samp = tamp.run();
  const int64_t P = amp.model.num_params();
  for (int r = 0; r < 2; r++) {
    CAPTURE(r);
    const MemoryStats& m = samp.rank_memory[static_cast<size_t>(r)];
    CHECK(m.current_of(MemCategory::Parameters) == 4 * P);
    CHECK(m.current_of(MemCategory::Gradients) == 4 * P);
    CHECK(m.current_of(MemCategory::MasterWeights) == 0);
    CHECK(m.current_of(MemCategory::OptimizerState) == 8 * P);
    // The layers' outputs and gradient buffers in 2 bytes; the loss's float32 probabilities and logit
    // gradients (E) as before; and autocast's two casts: the batch in 16 bits, the logits back in float32.
    const int64_t B = 32, D = amp.model.in_features(), C = amp.model.out_features(), E = 2 * B * C * 4;
    const int64_t fp32_peak = s32.rank_memory[static_cast<size_t>(r)].peak_of(MemCategory::Activations);
    CHECK(m.peak_of(MemCategory::Activations) == (fp32_peak - E) / 2 + E + B * D * 2 + B * C * 4);
    // DDP all-reduces the float32 gradients: 4 bytes a parameter, as without autocast.
    DType dt = DType::I64;
    CHECK(bucket_bytes(tamp, r, 2, dt) == 4 * P);
    CHECK(dt == DType::F32);
  }
  CHECK(tamp.rank_model(0).host_params() == tamp.rank_model(1).host_params());
  CHECK(tamp.rank_model(0).host_params() != t32.rank_model(0).host_params());  // the casts round

  // FSDP (FULL_SHARD) under autocast equals DDP under autocast: the same float32 gradients, sharded.
  TrainConfig fs = amp;
  fs.strategy = Strategy::Fsdp;
  Trainer tfs(fs);
  tfs.run();
  const std::vector<float> a = tfs.result_model().host_params(), b = tamp.result_model().host_params();
  double worst = 0;
  for (size_t i = 0; i < a.size(); i++) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
  CHECK(worst < 1e-5);
  // Under --tp the gathered model evaluates under autocast too (it evaluated in float32).
  TrainConfig tp = amp;
  tp.tp = 2;
  Trainer ttp(tp);
  ttp.run();
  CHECK(ttp.result_model().amp());

  // The spiral trains to >= 95% in bf16 and fp16 autocast, its loss curve within 2% of fp32's.
  const int64_t steps = test::quick() ? 120 : 300;
  TrainConfig single = test::demo_config("single", 1, 64, steps);
  Trainer ref(single);
  const test::Trained r32 = test::train(ref);
  // The curve: the mean loss of each 20 steps (one step's loss is one batch's, noisy when it is small).
  auto curve_of = [](const std::vector<StepReport>& steps) {
    std::vector<double> c;
    for (size_t i = 0; i + 20 <= steps.size(); i += 20) {
      double sum = 0;
      for (size_t k = i; k < i + 20; k++) sum += steps[k].loss;
      c.push_back(sum / 20);
    }
    return c;
  };
  const std::vector<double> c32 = curve_of(r32.steps);
  for (Precision p : {Precision::BF16, Precision::FP16}) {
    const std::string name = precision_name(p);
    CAPTURE(name);
    TrainConfig c = single;
    c.amp = p;
    Trainer t(c);
    const test::Trained r = test::train(t);
    REQUIRE(r.steps.size() == r32.steps.size());
    CHECK(r.summary.eval_accuracy >= 0.95);
    const std::vector<double> cm = curve_of(r.steps);
    // Within 2% of fp32's, plus 2.5e-3 absolute (a quarter percent of the starting loss of 1.1): once
    // the loss is a few hundredths, the two runs' trajectories (rounding amplified by AdamW, and by
    // SGD with momentum alike) wander by more than 2% of it while both keep training.
    double worst = 0;
    for (size_t i = 0; i < cm.size(); i++) {
      CAPTURE(i);
      CHECK(std::fabs(cm[i] - c32[i]) <= 0.02 * c32[i] + 2.5e-3);
      worst = std::max(worst, std::fabs(cm[i] - c32[i]) / c32[i]);
    }
    MESSAGE(name << " autocast: accuracy " << r.summary.eval_accuracy << ", each 20 steps' mean loss within " << worst << " of fp32's");
  }
}

TEST_CASE("--amp fp16: GradScaler on the float32 gradients skips an overflow on every rank, and --amp refusals are sentences") {
  TrainConfig c = test::demo_config("ddp", 2, 32, 4);
  c.amp = Precision::FP16;
  c.inject_overflow_steps = {2};
  Trainer t(c);
  const test::Trained r = test::train(t);
  REQUIRE(r.steps.size() == 4);
  CHECK(r.steps[1].step_skipped);
  CHECK(r.steps[1].loss_scale == 65536.0f);
  CHECK(r.steps[2].loss_scale == 32768.0f);  // backed off once
  CHECK_FALSE(r.steps[2].step_skipped);
  CHECK(std::isfinite(r.summary.eval_loss));
  TrainConfig both = test::demo_config("ddp", 2, 32, 2);
  both.amp = both.precision = Precision::BF16;
  CHECK(test::error_of(both) == "--amp with --precision: autocast keeps float32 parameters, --precision makes them 16-bit; choose one");
  TrainConfig bf = test::demo_config("ddp", 2, 32, 2);
  bf.amp = Precision::BF16;
  bf.inject_overflow_steps = {1};
  CHECK(test::error_of(bf) == "--inject-overflow makes fp16 gradients overflow (bf16 has float32's range); use --amp fp16");
  TrainConfig gpt = test::demo_config("ddp", 2, 32, 2);
  gpt.model = ModelSpec::parse("gpt:layers=1,heads=2,embd=8,ctx=4");
  gpt.data = "text";
  gpt.amp = Precision::BF16;
  CHECK(test::error_of(gpt).empty());  // autocast runs the GPT too (tests/test_gpt_amp.cpp)
  CHECK(feature_refusal(gpt, Feature::MixedPrecision).empty());
}
