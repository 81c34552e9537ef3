// The pipeline runtime (engine/parallel/pipeline.h): stages balanced or split as given, a stage's
// model equal to the full model's slice, the split backward (I + W = B), equality with one rank on
// the same batch for every schedule, p and m (and with data-parallel replicas), measured bubbles
// and in-flight micro-batches against the formulas, per-rank memory, events, checkpoints and the
// CLI's one-sentence errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli_util.h"
#include "cli/cli.h"
#include "engine/core/check.h"
#include "engine/core/format.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/parallel/pipeline_stats.h"
#include "engine/train/train.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

const char* kModel4 = "mlp:2,16,16,16,3";                // 4 Linear layers: up to 4 stages
const char* kModel8 = "mlp:2,16,16,16,16,16,16,16,3";    // 8 Linear layers: 4 ranks x 2 chunks

TrainConfig pipeline_config(const char* model, ScheduleKind kind, int p, int m, int64_t batch, int v = 1, int dp = 1) {
  TrainConfig c;
  c.strategy = Strategy::Pipeline;
  c.model = ModelSpec::parse(model);
  c.data = "spiral";
  c.batch = batch;
  c.steps = 20;
  c.seed = 5;
  c.optimizer = default_optimizer_config(OptimizerKind::AdamW);
  c.pipeline.stages = p;
  c.pipeline.microbatches = m;
  c.pipeline.schedule = kind;
  c.pipeline.chunks = v;
  c.pipeline.dp = dp;
  c.world_size = p * dp;
  c.timeout_s = 20;
  return c;
}

using test::max_abs_diff;
using test::single_like;
using test::train;
using Run = test::Trained;

// Trains the pipeline and compares it with `want` (one rank on the same samples); returns the
// largest parameter difference.
double check_equals_single(const TrainConfig& c, Trainer& one, const Run& want) {
  Trainer pipe(c);
  Run got = train(pipe);
  const double diff = max_abs_diff(pipe.model(), one.model());
  CHECK(diff <= 1e-5);
  REQUIRE(got.steps.size() == want.steps.size());
  for (size_t s = 0; s < got.steps.size(); s++) {
    CHECK(got.steps[s].samples == want.steps[s].samples);
    CHECK(got.steps[s].loss == doctest::Approx(want.steps[s].loss).epsilon(1e-5));
    CHECK(got.steps[s].accuracy == doctest::Approx(want.steps[s].accuracy));
  }
  CHECK(got.summary.eval_loss == doctest::Approx(want.summary.eval_loss).epsilon(1e-5));
  return diff;
}

using test::check_16bit_like_one_rank;

using test::CliResult;
using test::run_cli;

}  // namespace

TEST_SUITE("pipeline") {
  TEST_CASE("stages are balanced by parameter count, or cut as --split says") {
    // mlp:2,64,64,64,3: Linear layers of 192, 4160, 4160 and 195 parameters.
    const ModelSpec spec = ModelSpec::parse("mlp:2,64,64,64,3");
    CHECK(partition_stages(spec, 2) == std::vector<StageRange>{{0, 2}, {2, 4}});  // 4352 | 4355
    CHECK(partition_stages(spec, 3) == std::vector<StageRange>{{0, 2}, {2, 3}, {3, 4}});
    CHECK(partition_stages(spec, 4) == std::vector<StageRange>{{0, 1}, {1, 2}, {2, 3}, {3, 4}});
    CHECK(partition_stages(spec, 3, {1, 2, 1}) == std::vector<StageRange>{{0, 1}, {1, 3}, {3, 4}});
    CHECK(stage_num_params(spec, {0, 2}) == 4352);
    CHECK(stage_param_offset(spec, {2, 4}) == 4352);
    CHECK(describe_stage(spec, {0, 2}) == "Sequential 0-3 (2 Linear), 4,352 parameters");
    CHECK(describe_stage(spec, {2, 4}) == "Sequential 4-6 (2 Linear), 4,355 parameters");
    CHECK(parse_split("2,2,1") == std::vector<int>{2, 2, 1});
    CHECK_THROWS_WITH_AS(parse_split("2,,1"),
                         "--split '2,,1' has '' where a count of at least 1 belongs; write the Linear layers (a GPT: the "
                         "blocks) of each stage in model order, e.g. --split 2,2,1",
                         Error);
    CHECK_THROWS_WITH_AS(partition_stages(spec, 2, {2, 1}),
                         "--split covers 3 Linear layers but mlp:2,64,64,64,3 has 4; the counts must add up to the "
                         "model's Linear layers",
                         Error);
    CHECK_THROWS_WITH_AS(partition_stages(spec, 3, {2, 2}),
                         "--split gives 2 stages but the pipeline has 3 (--stages x --chunks); give one count per stage",
                         Error);
    CHECK_THROWS_WITH_AS(partition_stages(spec, 5),
                         "mlp:2,64,64,64,3 has 4 Linear layers, fewer than the 5 stages (--stages x --chunks); use a "
                         "deeper model or fewer stages",
                         Error);
  }

  TEST_CASE("a stage's model is the full model's slice, under the full model's names") {
    const ModelSpec spec = ModelSpec::parse("mlp:3,8,5,7,2");
    MemoryTracker mem;
    Model full(spec, nullptr, 11);
    Model stage(spec, &mem, 11, 1, 3);  // Linear 1 and 2: Sequential 2..5
    REQUIRE(stage.num_params() == stage_num_params(spec, {1, 3}));
    CHECK(stage.parameters().front().name == "2.weight");
    CHECK(stage.parameters().back().name == "4.bias");
    CHECK(stage.num_layers() == 4);  // Linear, ReLU, Linear, ReLU
    const int64_t off = stage_param_offset(spec, {1, 3});
    for (int64_t i = 0; i < stage.num_params(); i++) REQUIRE(stage.params()[i] == full.params()[off + i]);
    CHECK(mem.stats().current_of(MemCategory::Parameters) == 4 * stage.num_params());
    Model last(spec, nullptr, 11, 3, 4);
    CHECK(last.num_layers() == 1);  // the model's last Linear has no ReLU after it
  }

  TEST_CASE("the split backward (I, then W) equals the full backward") {
    const ModelSpec spec = ModelSpec::parse("mlp:6,5,4");
    Model a(spec, nullptr, 1), b(spec, nullptr, 1);
    const int64_t B = 7;
    std::mt19937 gen(3);
    std::normal_distribution<float> normal;
    std::vector<float> x(B * 6), dout(B * 5), out(B * 5), d1(B * 6), d2(B * 6);
    for (float& v : x) v = normal(gen);
    for (float& v : dout) v = normal(gen);
    a.zero_grad();
    b.zero_grad();
    a.layer_forward(0, out.data(), x.data(), B);
    a.layer_backward(0, d1.data(), dout.data(), x.data(), out.data(), B);
    b.layer_backward_input(0, d2.data(), dout.data(), out.data(), B);
    for (int64_t i = 0; i < b.num_params(); i++) REQUIRE(b.grads()[i] == 0.0f);  // I leaves the weights alone
    b.layer_backward_weight(0, dout.data(), x.data(), B);
    for (size_t i = 0; i < d1.size(); i++) CHECK(d1[i] == d2[i]);
    for (int64_t i = 0; i < a.num_params(); i++) CHECK(a.grads()[i] == b.grads()[i]);
  }

  TEST_CASE("every schedule, p in {2,3,4}, m in {1,4,8} equals one rank on the same batch after 20 steps") {
    // One reference per model: the pipeline's batch of 24 on one rank.
    TrainConfig base4 = pipeline_config(kModel4, ScheduleKind::GPipe, 2, 1, 24);
    Trainer one4(single_like(base4, 24));
    const Run want4 = train(one4);
    TrainConfig base8 = pipeline_config(kModel8, ScheduleKind::GPipe, 2, 1, 24);
    Trainer one8(single_like(base8, 24));
    const Run want8 = train(one8);
    int runs = 0;
    double worst = 0;
    for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZBH1, ScheduleKind::Interleaved1F1B})
      for (int p : {2, 3, 4})
        for (int m : {1, 4, 8}) {
          const bool interleaved = kind == ScheduleKind::Interleaved1F1B;
          if (interleaved && m % p != 0) continue;  // PyTorch's (and make_schedule's) rule
          CAPTURE(schedule_kind_name(kind));
          CAPTURE(p);
          CAPTURE(m);
          TrainConfig c = pipeline_config(interleaved ? kModel8 : kModel4, kind, p, m, 24, interleaved ? 2 : 1);
          worst = std::max(worst, check_equals_single(c, interleaved ? one8 : one4, interleaved ? want8 : want4));
          runs++;
        }
    CHECK(runs == 31);
    MESSAGE(runs, " pipelines, largest parameter difference from one rank after 20 steps: ", worst);
    // Fused point-to-point (each send posted with the next action's receive, as on NCCL): the
    // threads backend's sends are buffered, so fusing only moves when receives are posted, and the
    // results must not change.
    for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZBH1, ScheduleKind::Interleaved1F1B}) {
      const bool interleaved = kind == ScheduleKind::Interleaved1F1B;
      CAPTURE(schedule_kind_name(kind));
      TrainConfig c = pipeline_config(interleaved ? kModel8 : kModel4, kind, interleaved ? 2 : 3, 4, 24, interleaved ? 2 : 1);
      c.pipeline.fuse_p2p = true;
      check_equals_single(c, interleaved ? one8 : one4, interleaved ? want8 : want4);
    }
  }

  TEST_CASE("fused point-to-point with replicas and with empty micro-batches trains the same") {
    {  // an epoch's last batch of 6 rows for 8 micro-batches: some are empty
      TrainConfig c = pipeline_config(kModel4, ScheduleKind::ZBH1, 3, 8, 16);
      c.data = "spiral:points=34";
      c.steps = 14;
      c.pipeline.fuse_p2p = true;
      Trainer one(single_like(c, 16));
      const Run want = train(one);
      check_equals_single(c, one, want);
    }
    TrainConfig c = pipeline_config(kModel4, ScheduleKind::OneFOneB, 2, 4, 16, 1, 2);
    c.pipeline.fuse_p2p = true;
    Trainer one(single_like(c, 32));
    const Run want = train(one);
    check_equals_single(c, one, want);
  }

  TEST_CASE("LoRA with a pipeline equals LoRA on one rank after 3 steps, every schedule, some stages unadapted") {
    // The stages' adapters carry the one-rank model's names and initial values (lora_init_values
    // skips the draws of other stages' layers), so the runs agree step for step; ZB-H1 runs the
    // adapters' backward in its two halves. --lora-layers 0,4 leaves every odd stage of kModel4
    // without a trainable parameter.
    double worst = 0;
    int runs = 0;
    for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZBH1, ScheduleKind::Interleaved1F1B})
      for (const std::vector<int>& layers : {std::vector<int>{}, std::vector<int>{0, 4}}) {
        const bool interleaved = kind == ScheduleKind::Interleaved1F1B;
        CAPTURE(schedule_kind_name(kind));
        CAPTURE(layers.size());
        TrainConfig c = pipeline_config(interleaved ? kModel8 : kModel4, kind, interleaved ? 2 : 4, 4, 16, interleaved ? 2 : 1);
        c.steps = 3;
        c.lora.rank = 4;
        c.lora.layers = layers;
        Trainer one(single_like(c, 16));
        const Run want = train(one);
        REQUIRE(one.model().lora());
        worst = std::max(worst, check_equals_single(c, one, want));
        Trainer pipe(c);
        pipe.run();
        REQUIRE(pipe.model().parameters().size() == one.model().parameters().size());
        for (size_t i = 0; i < one.model().parameters().size(); i++)
          CHECK(pipe.model().parameters()[i].name == one.model().parameters()[i].name);
        // The adapters moved (B starts at zero), and the frozen base did not: the merged models agree.
        double moved = 0;
        for (const Parameter& p : one.model().parameters())
          if (p.name.find("lora_B") != std::string::npos)
            for (int64_t i = 0; i < p.numel; i++) moved = std::max(moved, static_cast<double>(std::fabs(p.data[i])));
        CHECK(moved > 1e-4);
        const std::vector<float> a = pipe.model().merged_params(), b = one.model().merged_params();
        REQUIRE(a.size() == b.size());
        for (size_t i = 0; i < a.size(); i++) CHECK(std::fabs(a[i] - b[i]) <= 1e-5);
        runs++;
      }
    CHECK(runs == 8);
    MESSAGE("LoRA: ", runs, " pipelines, largest adapter difference from one rank after 3 steps: ", worst);
  }

  TEST_CASE("LoRA with a pipeline: --save writes the one-rank run's adapter file, --init starts the frozen base") {
    test::TempDir dir;
    TrainConfig c = pipeline_config(kModel4, ScheduleKind::OneFOneB, 4, 4, 16);
    c.steps = 3;
    c.lora.rank = 4;
    c.save_path = dir.file("pipe.safetensors");
    TrainConfig single = single_like(c, 16);
    single.save_path = dir.file("single.safetensors");
    Trainer(c).run();
    Trainer(single).run();
    const SafetensorsFile got = load_safetensors(c.save_path), want = load_safetensors(single.save_path);
    std::map<std::string, std::string> meta = got.metadata;  // the same but for where it was trained
    CHECK(meta.at("strategy") == "pipeline");
    meta["strategy"] = want.metadata.at("strategy");
    meta["world"] = want.metadata.at("world");
    CHECK(meta == want.metadata);
    REQUIRE(got.entries.size() == want.entries.size());
    REQUIRE(got.entries.size() == 8);  // A and B of 4 Linears
    for (const SafetensorsEntry& w : want.entries) {
      CAPTURE(w.name);
      const SafetensorsEntry* g = got.find(w.name);
      REQUIRE(g != nullptr);
      REQUIRE(g->shape == w.shape);
      const int64_t n = (w.end - w.begin) / 4;
      std::vector<float> gv(static_cast<size_t>(n)), wv(static_cast<size_t>(n));
      std::memcpy(gv.data(), got.bytes(*g), static_cast<size_t>(n) * 4);
      std::memcpy(wv.data(), want.bytes(w), static_cast<size_t>(n) * 4);
      for (int64_t i = 0; i < n; i++) CHECK(std::fabs(gv[static_cast<size_t>(i)] - wv[static_cast<size_t>(i)]) <= 1e-5);
    }
    // --init: a plain checkpoint becomes every stage's frozen base, as it does the one-rank model's.
    TrainConfig plain = pipeline_config(kModel4, ScheduleKind::OneFOneB, 4, 4, 16);
    plain.steps = 5;
    plain.save_path = dir.file("base.safetensors");
    Trainer(plain).run();
    c.save_path.clear();
    c.init_path = plain.save_path;
    Trainer a(c), b(single_like(c, 16));
    a.run();
    b.run();
    CHECK(max_abs_diff(a.model(), b.model()) <= 1e-5);
    const std::vector<float> ma = a.model().merged_params(), mb = b.model().merged_params();
    Model base(c.model, nullptr, 99);
    load_checkpoint(plain.save_path, base);
    double from_seed = 0;  // the base came from the file, not from the seed
    for (size_t i = 0; i < ma.size(); i++) {
      CHECK(std::fabs(ma[i] - mb[i]) <= 1e-5);
      from_seed = std::max(from_seed, static_cast<double>(std::fabs(b.model().base_parameters().front().data[i] - base.params()[i])));
    }
    CHECK(from_seed == 0);
    Model seeded(c.model, nullptr, c.seed);
    CHECK(max_abs_diff(seeded, base) > 1e-3);
  }

  TEST_CASE("SGD with momentum and AdamW, a hand-made split, and data-parallel replicas") {
    SUBCASE("SGD with momentum, 1F1B, split 1,2,1") {
      TrainConfig c = pipeline_config(kModel4, ScheduleKind::OneFOneB, 3, 4, 24);
      c.optimizer = default_optimizer_config(OptimizerKind::SGD);
      c.optimizer.momentum = 0.9;
      c.pipeline.split = {1, 2, 1};
      Trainer one(single_like(c, 24));
      const Run want = train(one);
      check_equals_single(c, one, want);
    }
    SUBCASE("an epoch's last batch, smaller than m, is cut like torch.tensor_split (some micro-batches empty)") {
      // 102 samples in batches of 16: six full batches, then 6 rows for 8 micro-batches.
      TrainConfig c = pipeline_config(kModel4, ScheduleKind::ZBH1, 3, 8, 16);
      c.data = "spiral:points=34";
      c.steps = 14;
      Trainer one(single_like(c, 16));
      const Run want = train(one);
      REQUIRE(want.steps[6].batch_size == 6);
      check_equals_single(c, one, want);
    }
    SUBCASE("--dp 2 equals one rank with twice the batch") {
      for (ScheduleKind kind : {ScheduleKind::OneFOneB, ScheduleKind::ZBH1}) {
        for (OptimizerKind opt : {OptimizerKind::SGD, OptimizerKind::AdamW}) {
          CAPTURE(schedule_kind_name(kind));
          CAPTURE(optimizer_name(opt));
          TrainConfig c = pipeline_config(kModel4, kind, 2, 4, 16, 1, 2);
          c.optimizer = default_optimizer_config(opt);
          if (opt == OptimizerKind::SGD) c.optimizer.momentum = 0.9;
          // Replica d's sampler takes every 2nd index of the same permutation: one rank with batch
          // 32 sees the union of the two replicas' batches.
          Trainer one(single_like(c, 32));
          const Run want = train(one);
          check_equals_single(c, one, want);
        }
      }
    }
  }

  TEST_CASE("with equal action costs and free links the measured bubble equals the formula") {
    struct Case {
      ScheduleKind kind;
      int v;
      const char* model;
    };
    MESSAGE("p = 4, m = 8, every F, B, I, W 1 ms, profile ideal: bubble per rank, measured vs formula (of wall time)");
    for (Case k : {Case{ScheduleKind::GPipe, 1, kModel4}, Case{ScheduleKind::OneFOneB, 1, kModel4},
                   Case{ScheduleKind::Interleaved1F1B, 2, kModel8}, Case{ScheduleKind::ZBH1, 1, kModel4}}) {
      CAPTURE(schedule_kind_name(k.kind));
      TrainConfig c = pipeline_config(k.model, k.kind, 4, 8, 16, k.v);
      c.steps = 3;
      c.profile = "ideal";
      c.pipeline.fixed_costs = ActionCosts{1e-3, 1e-3, 1e-3, 1e-3, 0};
      Trainer t(c);
      Run r = train(t);
      const double formula = formula_bubble(k.kind, 4, 8, k.v, *c.pipeline.fixed_costs).of_wall;
      const ScheduleTiming sim = simulate(t.pipeline_plan()->schedule, *c.pipeline.fixed_costs);
      std::string line = std::string(schedule_kind_name(k.kind)) + ":";
      REQUIRE(r.summary.pipeline.ranks.size() == 4);
      for (const PipelineRankStats& s : r.summary.pipeline.ranks) {
        CAPTURE(s.rank);
        CHECK(s.bubble == doctest::Approx(formula).epsilon(1e-9));
        CHECK(s.formula_bubble == doctest::Approx(formula).epsilon(1e-12));
        CHECK(s.bubble == doctest::Approx(sim.bubble[static_cast<size_t>(s.rank)]).epsilon(1e-9));
        char cell[64];
        std::snprintf(cell, sizeof cell, "  rank %d %.4f vs %.4f", s.rank, s.bubble, formula);
        line += cell;
      }
      for (const StepReport& s : r.steps) {
        REQUIRE(s.bubble.size() == 4);
        for (double b : s.bubble) CHECK(b == doctest::Approx(formula).epsilon(1e-9));
      }
      CHECK(r.summary.pipeline.makespan == doctest::Approx(sim.makespan).epsilon(1e-9));
      MESSAGE(line);
    }
    // GPipe's (p-1)/(m+p-1) in numbers.
    CHECK(formula_bubble(ScheduleKind::GPipe, 4, 8).of_wall == doctest::Approx(3.0 / 11.0));
  }

  TEST_CASE("measured peak in-flight micro-batches equal the formulas, and activation memory follows them") {
    for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZBH1, ScheduleKind::Interleaved1F1B}) {
      const bool interleaved = kind == ScheduleKind::Interleaved1F1B;
      CAPTURE(schedule_kind_name(kind));
      TrainConfig c = pipeline_config(interleaved ? kModel8 : kModel4, kind, 4, 8, 16, interleaved ? 2 : 1);
      c.steps = 2;
      Trainer t(c);
      Run r = train(t);
      for (const PipelineRankStats& s : r.summary.pipeline.ranks) {
        CAPTURE(s.rank);
        CHECK(s.peak_inflight == formula_peak_inflight(kind, s.pipe_rank, 4, 8, interleaved ? 2 : 1));
        CHECK(s.peak_inflight == s.formula_peak_inflight);
        CHECK(s.peak_inflight_w == s.formula_peak_inflight_w);
        CHECK(s.peak_inflight == measured_peak_inflight(t.pipeline_plan()->schedule, s.pipe_rank));
      }
      if (kind == ScheduleKind::GPipe) {
        // Rank 1 holds Linear 1 (16 -> 16): each micro-batch of 2 rows keeps its received input, the
        // Linear's and the ReLU's outputs (3 x 2 x 16 floats) until its B; GPipe holds all 8 at once.
        // The peak adds B's two gradient buffers of one micro-batch (2 x 2 x 16 floats).
        CHECK(r.summary.rank_memory[1].peak_of(MemCategory::Activations) == (8 * 3 * 2 * 16 + 2 * 2 * 16) * 4);
      }
      if (kind == ScheduleKind::OneFOneB) {
        // 1F1B holds min(p - r, m) = 3 micro-batches on rank 1.
        CHECK(r.summary.rank_memory[1].peak_of(MemCategory::Activations) == (3 * 3 * 2 * 16 + 2 * 2 * 16) * 4);
      }
    }
  }

  TEST_CASE("each rank holds only its stages' parameters, gradients and optimizer state") {
    TrainConfig c = pipeline_config("mlp:2,64,64,64,3", ScheduleKind::OneFOneB, 2, 4, 16);
    c.steps = 2;
    Trainer t(c);
    TrainSummary s = t.run();
    const ModelSpec& spec = c.model;
    REQUIRE(s.rank_memory.size() == 2);
    for (int r = 0; r < 2; r++) {
      CAPTURE(r);
      const int64_t bytes = 4 * stage_num_params(spec, t.pipeline_plan()->stages[static_cast<size_t>(r)]);
      const MemoryStats& m = s.rank_memory[static_cast<size_t>(r)];
      CHECK(m.current_of(MemCategory::Parameters) == bytes);
      CHECK(m.current_of(MemCategory::Gradients) == bytes);
      CHECK(m.current_of(MemCategory::OptimizerState) == 2 * bytes);  // AdamW's two moments
      CHECK(m.current_of(MemCategory::Activations) == 0);              // nothing in flight after the step
    }
    CHECK(s.rank_memory[0].current_of(MemCategory::Parameters) == 4 * 4352);
    CHECK(s.rank_memory[1].current_of(MemCategory::Parameters) == 4 * 4355);
  }

  TEST_CASE("bf16 and fp16 pipelines train like one 16-bit rank, and their messages carry half of fp32's bytes") {
    // Megatron's bf16 pipeline: 16-bit stages, 16-bit activations and gradients between them, fp32
    // master weights; 3 SGD steps against one 16-bit rank (check_16bit_like_one_rank). Quick runs (the
    // sanitizers) leave out fp16 and LoRA.
    std::vector<Precision> precisions{Precision::BF16};
    std::vector<int> loras{0};
    if (!test::quick()) precisions.push_back(Precision::FP16), loras.push_back(4);
    int runs = 0;
    for (Precision p : precisions)
      for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZBH1, ScheduleKind::Interleaved1F1B})
        for (int lora : loras) {
          const bool interleaved = kind == ScheduleKind::Interleaved1F1B;
          const std::string what = std::string(precision_name(p)) + " " + schedule_kind_name(kind) + " lora " + std::to_string(lora);
          CAPTURE(what);
          TrainConfig c = pipeline_config(interleaved ? kModel8 : kModel4, kind, 2, 4, 16, interleaved ? 2 : 1);
          c.steps = 3;
          c.precision = p;
          c.lora.rank = lora;
          c.optimizer = default_optimizer_config(OptimizerKind::SGD);
          c.optimizer.lr = 0.1;
          Trainer pipe(c);
          check_16bit_like_one_rank(c, pipe);
          REQUIRE(pipe.model().mixed());
          runs++;
          if (kind != ScheduleKind::GPipe || lora != 0) continue;
          // Stage 0's F sends 4 rows of 16 activations in 16 bits: half of float32's 256 bytes.
          int sends = 0;
          for (const Event& e : pipe.recorder().all_events())
            if (e.kind == EventKind::PipelineAction && e.pipe.stage == 0 && e.pipe.type == ActionType::Forward) {
              CHECK(e.pipe.bytes == 4 * 16 * 2);
              sends++;
            }
          CHECK(sends == 3 * 4);
        }
    CHECK(runs == 4 * static_cast<int>(precisions.size() * loras.size()));
  }

  TEST_CASE("a 16-bit pipeline: ZB-H1's split backward equals 1F1B's, and an fp16 overflow skips the step on every rank") {
    // One micro-batch per stage: I then W adds the same 16-bit gradients as B, bit for bit (with and
    // without LoRA, whose adapters' backward splits too).
    for (int lora : {0, 4}) {
      CAPTURE(lora);
      TrainConfig c = pipeline_config(kModel4, ScheduleKind::OneFOneB, 2, 1, 16);
      c.steps = 3;
      c.precision = Precision::BF16;
      c.lora.rank = lora;
      test::zb_h1_equals_1f1b(c);
    }
    // fp16: rank 1 (the last stage) scales its loss by a further 2^24 on step 2 (counted from 1, as
    // --inject-overflow counts); its gradients and the ones it sends back overflow, every rank of both
    // replicas skips that step, and the scale halves.
    TrainConfig c = pipeline_config(kModel4, ScheduleKind::OneFOneB, 2, 4, 16, 1, 2);
    c.steps = 4;
    c.precision = Precision::FP16;
    c.inject_overflow_steps = {2};
    c.inject_overflow_rank = 1;
    Trainer t(c);
    const Run r = train(t);
    REQUIRE(r.steps.size() == 4);
    CHECK(!r.steps[0].step_skipped);
    CHECK(r.steps[1].step_skipped);
    CHECK(!r.steps[2].step_skipped);
    CHECK(r.steps[0].loss_scale == 65536.0f);
    CHECK(r.steps[2].loss_scale == 32768.0f);
    REQUIRE(r.summary.rank_skipped_steps.size() == 4);
    for (const auto& skipped : r.summary.rank_skipped_steps) CHECK(skipped == std::vector<int64_t>{2});
  }

  TEST_CASE("--amp in a pipeline: float32 stages under autocast train like one autocast rank, with 16-bit messages") {
    // torch.autocast inside each stage: float32 parameters, gradients and optimizer (no master copy),
    // 16-bit activations, so the stages send each other 16-bit tensors. Each micro-batch's weight
    // gradient is rounded to 16 bits before it adds into the float32 .grad, one rank's batch once:
    // the runs agree within the dtype's rounding at each tensor's scale, as the --precision pipelines.
    std::vector<Precision> amps{Precision::BF16};
    if (!test::quick()) amps.push_back(Precision::FP16);
    for (Precision p : amps)
      for (ScheduleKind kind : {ScheduleKind::OneFOneB, ScheduleKind::ZBH1}) {
        const std::string what = std::string(precision_name(p)) + " " + schedule_kind_name(kind);
        CAPTURE(what);
        TrainConfig c = pipeline_config(kModel4, kind, 2, 4, 16);
        c.steps = 3;
        c.amp = p;
        c.optimizer = default_optimizer_config(OptimizerKind::SGD);
        c.optimizer.lr = 0.1;
        Trainer pipe(c);
        const Run got = check_16bit_like_one_rank(c, pipe);
        CHECK(!pipe.model().mixed());
        // Stage 0's F sends 4 rows of 16 activations in 16 bits; the gradients stay float32 (4 bytes each).
        for (const Event& e : pipe.recorder().all_events())
          if (e.kind == EventKind::PipelineAction && e.pipe.stage == 0 && e.pipe.type == ActionType::Forward) CHECK(e.pipe.bytes == 4 * 16 * 2);
        const MemoryStats& m = got.summary.rank_memory[0];
        CHECK(m.current_of(MemCategory::Parameters) == 4 * stage_num_params(pipe.config().model, pipe.pipeline_plan()->stages[0]));  // float32
      }
    // fp16: GradScaler on the float32 gradients; an overflow on the last stage skips step 2 everywhere.
    TrainConfig c = pipeline_config(kModel4, ScheduleKind::OneFOneB, 2, 4, 16);
    c.steps = 3;
    c.amp = Precision::FP16;
    c.inject_overflow_steps = {2};
    c.inject_overflow_rank = 1;
    Trainer t(c);
    const Run r = train(t);
    REQUIRE(r.steps.size() == 3);
    CHECK(!r.steps[0].step_skipped);
    CHECK(r.steps[1].step_skipped);
    CHECK(r.steps[2].loss_scale == 32768.0f);
    for (const auto& skipped : r.summary.rank_skipped_steps) CHECK(skipped == std::vector<int64_t>{2});
  }

  TEST_CASE("every action is an event on the compute lane, and the trace shows them by PyTorch's names") {
    test::TempDir dir;
    TrainConfig c = pipeline_config(kModel4, ScheduleKind::ZBH1, 2, 4, 16);
    c.steps = 2;
    c.trace_path = dir.file("pipe.json");
    Trainer t(c);
    t.run();
    const PipelineSchedule& sched = t.pipeline_plan()->schedule;
    std::vector<int> per_rank(2, 0);
    for (const Event& e : t.recorder().all_events()) {
      if (e.kind != EventKind::PipelineAction) continue;
      per_rank[static_cast<size_t>(e.rank)]++;
      CHECK(e.lane == Lane::Compute);
      CHECK(e.model_end >= e.model_begin);
      CHECK(e.pipe.stage == e.rank);
      CHECK(e.pipe.num_stages == 2);
      CHECK(e.pipe.microbatches == 4);
      const auto& cell = sched.order[static_cast<size_t>(e.rank)][static_cast<size_t>(e.pipe.step)];
      REQUIRE(cell.has_value());
      CHECK(*cell == Action{e.pipe.stage, e.pipe.type, e.pipe.mb});
      // Sends: stage 0's F and stage 1's I carry 4 rows of 16 floats; the rest send nothing.
      const bool sends = (e.pipe.stage == 0 && e.pipe.type == ActionType::Forward) ||
                         (e.pipe.stage == 1 && e.pipe.type == ActionType::BackwardInput);
      CHECK(e.pipe.bytes == (sends ? 4 * 16 * 4 : 0));
    }
    // 4 F, 4 I and 4 W per rank and iteration.
    CHECK(per_rank == std::vector<int>{24, 24});
    std::ifstream f(c.trace_path);
    const std::string json((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    CHECK(json.find("\"name\":\"1W3\",\"cat\":\"pipeline\"") != std::string::npos);
    CHECK(event_kind_name(EventKind::PipelineAction) == std::string("pipeline_action"));
  }

  TEST_CASE("--save gathers the stages into one checkpoint, and --init starts every stage from one") {
    test::TempDir dir;
    TrainConfig c = pipeline_config(kModel4, ScheduleKind::OneFOneB, 4, 4, 16);
    c.steps = 5;
    c.save_path = dir.file("pipe.safetensors");
    Trainer t(c);
    t.run();
    Model loaded(c.model, nullptr, 99);
    load_checkpoint(c.save_path, loaded);
    CHECK(max_abs_diff(loaded, t.model()) == 0);

    TrainConfig single = single_like(c, 16);
    single.save_path = dir.file("single.safetensors");
    Trainer one(single);
    one.run();
    CHECK(max_abs_diff(loaded, one.model()) <= 1e-5);

    TrainConfig again = c;
    again.save_path.clear();
    again.init_path = c.save_path;
    TrainConfig again_single = single_like(again, 16);
    Trainer a(again), b(again_single);
    a.run();
    b.run();
    CHECK(max_abs_diff(a.model(), b.model()) <= 1e-5);
  }

  TEST_CASE("bad configurations get one sentence") {
    TrainConfig c = pipeline_config(kModel4, ScheduleKind::OneFOneB, 2, 4, 16, 1, 2);
    c.world_size = 3;
    CHECK_THROWS_WITH_AS(Trainer{c},
                         "--world 3 is not --stages 2 x --dp 2 = 4; a pipeline run has one rank per stage per replica "
                         "(drop --world)",
                         Error);
    c = pipeline_config(kModel4, ScheduleKind::OneFOneB, 2, 4, 18);
    CHECK_THROWS_WITH_AS(Trainer{c},
                         "--batch 18 does not split into 4 equal micro-batches; use a multiple of --microbatches "
                         "(--batch is one pipeline replica's batch)",
                         Error);
    c = pipeline_config(kModel4, ScheduleKind::Interleaved1F1B, 2, 3, 18, 2);
    CHECK_THROWS_WITH_AS(Trainer{c},
                         "Interleaved 1F1B runs micro-batches in rounds of one per rank, so the micro-batches (3) must "
                         "be a multiple of the ranks (2), as in PyTorch",
                         Error);
    c = pipeline_config(kModel4, ScheduleKind::OneFOneB, 2, 4, 16);
    c.accum = 2;
    CHECK_THROWS_WITH_AS(Trainer{c},
                         "--accum with --strategy pipeline: the micro-batches are the pipeline's accumulation; use --microbatches",
                         Error);
  }

  TEST_CASE("dtlab-cli train --strategy pipeline: header, per-rank table, JSON, and flag errors") {
    CliResult r = run_cli({"train", "--strategy", "pipeline", "--stages", "4", "--microbatches", "8", "--schedule",
                           "gpipe", "--model", kModel4, "--batch", "16", "--steps", "3", "--unit-costs", "--profile",
                           "ideal"});
    INFO(r.out, r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("pipeline: GPipe, 4 stages on 4 ranks, 8 micro-batches of 2 samples, 1 replica; effective batch 16") !=
          std::string::npos);
    CHECK(r.out.find("stage 3 on rank 3: Sequential 6-6 (1 Linear), 51 parameters") != std::string::npos);
    CHECK(r.out.find("27.3%    27.3%") != std::string::npos);  // (p-1)/(m+p-1) = 3/11, measured and formula

    CliResult j = run_cli({"train", "--strategy", "pipeline", "--stages", "2", "--dp", "2", "--schedule", "zb-h1",
                           "--model", kModel4, "--batch", "8", "--steps", "2", "--json"});
    REQUIRE(j.code == 0);
    std::istringstream lines(j.out);
    std::string line, last;
    int steps = 0;
    while (std::getline(lines, line)) {
      if (line.find("\"bubble\":[") != std::string::npos) steps++;
      last = line;
    }
    CHECK(steps == 2);
    CHECK(last.find("\"pipeline\":{") != std::string::npos);
    CHECK(last.find("\"formula_peak_inflight_until_w\":2") != std::string::npos);

    auto usage = [](const std::vector<std::string>& args, const std::string& expect) {
      CliResult e = run_cli(args);
      INFO(e.err);
      CHECK(e.code == 2);
      CHECK(e.out.empty());
      CHECK(e.err.find(expect) != std::string::npos);
      CHECK(e.err.find('\n') == e.err.size() - 1);
    };
    usage({"train", "--strategy", "ddp", "--world", "2", "--stages", "2"},
          "--stages configures a pipeline; add --strategy pipeline --stages p");
    usage({"train", "--microbatches", "4"}, "--microbatches configures a pipeline; add --strategy pipeline --stages p");
    usage({"train", "--strategy", "pipeline", "--stages", "2", "--dp", "2", "--world", "3", "--model", kModel4},
          "--world 3 is not --stages 2 x --dp 2 = 4");
    usage({"train", "--strategy", "pipeline", "--stages", "2", "--split", "1,2", "--model", kModel4},
          "--split covers 3 Linear layers but mlp:2,16,16,16,3 has 4");
    usage({"train", "--strategy", "pipeline", "--schedule", "pipedream"}, "'pipedream' is not a pipeline schedule");
  }
}
