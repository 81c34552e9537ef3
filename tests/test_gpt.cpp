// nanoGPT's GPT in the engine (engine/core/gpt.h): the spec's sentences, nanoGPT's parameter names and
// count, the backward against finite differences, token data, and the runs it takes or refuses.
// tests/gpt_torch.py holds it to PyTorch (init, 20 steps single and DDP, the checkpoint).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "engine/core/gpt.h"
#include "engine/core/ops.h"
#include "engine/core/vec_math.h"
#include "engine/data/loader.h"
#include "engine/data/sampler.h"
#include "engine/comm/threads_backend.h"
#include "engine/parallel/data_parallel.h"
#include "engine/parallel/memory_plan.h"
#include "engine/parallel/tensor_parallel.h"
#include "engine/train/train.h"
#include "tests/cli_util.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

namespace dtlab {

namespace {

std::string parse_error(const std::string& text) {
  return test::error_sentence([&] { ModelSpec::parse(text); });
}

// The mean cross-entropy over every position of a GPT's forward.
double gpt_loss(Model& m, const std::vector<int64_t>& idx, const std::vector<int64_t>& tgt, int64_t B) {
  const int64_t rows = B * m.spec().gpt.ctx, V = m.spec().gpt.vocab;
  std::vector<float> probs(static_cast<size_t>(rows * V));
  return cross_entropy_forward(probs.data(), m.forward_tokens(idx.data(), B), tgt.data(), rows, V);
}

// AdamW and SGD; the sanitizer runs (quick) AdamW only: the same code paths, half the time.
std::vector<OptimizerKind> optimizers_to_run() {
  std::vector<OptimizerKind> optimizers = {OptimizerKind::AdamW, OptimizerKind::SGD};
  if (test::quick()) optimizers.pop_back();
  return optimizers;
}

// A small GPT (2 heads, 16 wide, 8 positions) on the shipped text: batch 4, 3 steps of AdamW.
TrainConfig gpt_config(const std::string& strategy, int world, int layers) {
  TrainConfig c = test::demo_config(strategy, world, 4, 3);
  c.model = ModelSpec::parse("gpt:layers=" + std::to_string(layers) + ",heads=2,embd=16,ctx=8");
  c.data = "text";
  c.eval_samples = 256;  // (the final evaluation: the whole text is 12k samples, most of a test run)
  return c;
}

std::filesystem::path write_text(const std::string& name, const std::string& text) {
  const auto p = std::filesystem::temp_directory_path() / name;
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

// The collectives of a TP group whose other ranks are absent: a shard's pass runs with its own
// shapes and allocations (what the memory tests count), not the group's values.
struct EchoTpComm : TensorParallelComm {
  using TensorParallelComm::all_gather;
  using TensorParallelComm::all_reduce;
  using TensorParallelComm::reduce_scatter;
  void all_reduce(void*, int64_t, DType, int) override {}
  void all_gather(void* out, const void* in, int64_t n, DType dt, int) override {
    const size_t bytes = static_cast<size_t>(n * dtype_size(dt));
    for (int r = 0; r < 2; r++) std::memcpy(static_cast<char*>(out) + r * bytes, in, bytes);
  }
  void reduce_scatter(void* out, const void* in, int64_t n, DType dt, int) override {
    std::memcpy(out, in, static_cast<size_t>(n * dtype_size(dt)));
  }
};

}  // namespace

TEST_SUITE("gpt") {
  TEST_CASE("gpt in bf16 and fp16: 16-bit parameters, gradients and activations, every strategy equal one 16-bit rank within rounding") {
    // tests/gpt_torch.py holds bf16 to torch's GPT in bf16 with fp32 master weights; here the
    // strategies are held to each other. SGD with momentum: its step is linear in the gradient, so a
    // rounding difference stays rounding-sized (AdamW's normalised step can make it a whole lr).
    // The sanitizer runs (quick) take bf16 and the cases with every option: the same code paths, a
    // quarter of this case's 136 s under ASan.
    std::vector<Precision> precisions = {Precision::BF16, Precision::FP16};
    if (test::quick()) precisions.pop_back();
    for (Precision p : precisions) {
      CAPTURE(precision_name(p));
      TrainConfig one = gpt_config("single", 1, 2);
      one.model = ModelSpec::parse("gpt:layers=2,heads=4,embd=16,ctx=8");
      one.precision = p;
      one.optimizer = default_optimizer_config(OptimizerKind::SGD);
      one.optimizer.lr = 0.1;
      one.optimizer.momentum = 0.9;
      Trainer ref(one);
      const TrainSummary rs = ref.run();
      CHECK(ref.model().mixed());
      TrainConfig exact = one;  // the float32 run: the rounding error the 16-bit one carries already
      exact.precision = Precision::FP32;
      Trainer ref32(exact);
      ref32.run();
      const double rtol = p == Precision::BF16 ? 1.6e-2 : 1e-3;  // torch.testing's for the dtype
      CHECK(std::isfinite(rs.eval_loss));
      // 2 + 2 bytes per parameter in the model, the fp32 master copy beside the optimizer's state.
      const MemoryStats& m = rs.memory;
      const int64_t P = ref.model().num_params();
      CHECK(m.peak[static_cast<size_t>(MemCategory::Parameters)] == 2 * P);
      CHECK(m.peak[static_cast<size_t>(MemCategory::Gradients)] == 2 * P);
      CHECK(m.peak[static_cast<size_t>(MemCategory::MasterWeights)] == 4 * P);
      // One replica split over two ranks (TP, with sequence parallelism and recompute), and two
      // pipeline schedules over two stages: the same batches as the one rank.
      struct Case {
        const char* strategy;
        int tp;
        bool sp, recompute;
        const char* schedule;
        int stages = 2, chunks = 1;
      };
      // (The interleaved schedule on one rank sums the tied weight's two 16-bit gradients in place.)
      std::vector<Case> same = {{"ddp", 2, true, true, ""}, {"pipeline", 1, false, false, "interleaved", 1, 2}};
      if (!test::quick())
        same.insert(same.end(), {{"ddp", 2, false, false, ""}, {"pipeline", 1, false, false, "1f1b"}, {"pipeline", 1, false, true, "zb-h1"}});
      for (const Case& k : same) {
        CAPTURE(k.strategy);
        CAPTURE(k.tp);
        CAPTURE(k.sp);
        CAPTURE(k.schedule);
        TrainConfig c = one;
        c.strategy = parse_strategy(k.strategy);
        c.world_size = c.strategy == Strategy::Pipeline ? k.stages : 2;
        c.tp = k.tp;
        c.sequence_parallel = k.sp;
        c.activation_checkpointing = k.recompute;
        if (c.strategy == Strategy::Pipeline) {
          c.pipeline.stages = k.stages;
          c.pipeline.chunks = k.chunks;
          c.pipeline.microbatches = 2;
          c.pipeline.schedule = parse_schedule_kind(k.schedule);
        }
        Trainer t(c);
        const TrainSummary s = t.run();
        CHECK(test::differs_at_tensor_scale(ref.model().spec(), t.result_model().host_params(), ref.model().host_params(),
                                            ref32.model().host_params(), rtol) == "");
        CHECK(s.eval_loss == doctest::Approx(rs.eval_loss).epsilon(1e-2));
      }
      // Two replicas: DDP's 16-bit buckets against FSDP's 16-bit reduce-scatters and DataParallel's
      // reduce-add onto rank 0.
      TrainConfig d = one;
      d.strategy = Strategy::Ddp;
      d.world_size = 2;
      Trainer ddp(d);
      ddp.run();
      TrainConfig d32 = d;
      d32.precision = Precision::FP32;
      Trainer ddp32(d32);
      ddp32.run();
      std::vector<const char*> replicas = {"fsdp", "dp"};
      if (test::quick()) replicas.pop_back();
      for (const char* strategy : replicas) {
        CAPTURE(strategy);
        TrainConfig c = d;
        c.strategy = parse_strategy(strategy);
        Trainer t(c);
        t.run();
        CHECK(test::differs_at_tensor_scale(ref.model().spec(), t.result_model().host_params(), ddp.model().host_params(),
                                            ddp32.model().host_params(), rtol) == "");
      }
      // LoRA on block 0 only, over two stages: the second trains nothing and turns only its frozen
      // base 16-bit (it once refused, holding no parameters to convert).
      TrainConfig lo = one;
      lo.lora.rank = 4;
      lo.lora.layers = {0};
      Trainer lone(lo);
      lone.run();
      TrainConfig lp = lo;
      lp.strategy = Strategy::Pipeline;
      lp.world_size = lp.pipeline.stages = 2;
      lp.pipeline.microbatches = 2;
      Trainer lpipe(lp);
      lpipe.run();
      const double lora_diff = test::max_abs_diff(lpipe.result_model().host_params(), lone.model().host_params());
      MESSAGE("LoRA on block 0 over two stages: " << lora_diff << " from one rank");
      CHECK(lora_diff < 1e-3);
      // Recompute runs the same 16-bit ops again: bit for bit.
      TrainConfig r = d;
      r.activation_checkpointing = true;
      Trainer rec(r);
      rec.run();
      CHECK(test::max_abs_diff(rec.model().host_params(), ddp.model().host_params()) == 0.0);
    }
  }

  TEST_CASE("gpt in fp16: an overflow on one rank skips exactly that step on every rank and halves the scale") {
    TrainConfig c = gpt_config("ddp", 2, 1);
    c.precision = Precision::FP16;
    c.steps = 5;
    c.inject_overflow_steps = {2, 4};
    c.inject_overflow_rank = 1;
    Trainer t(c);
    const TrainSummary s = t.run();
    REQUIRE(s.rank_skipped_steps.size() == 2);
    for (const auto& r : s.rank_skipped_steps) CHECK(r == std::vector<int64_t>{2, 4});
    CHECK(s.loss_scale == 65536.0f / 4);
    CHECK(std::isfinite(s.eval_loss));
  }

  TEST_CASE("vectorized exp and erf: within an ulp or two of libm's and torch's bound, NaN stays NaN") {
    double worst_exp = 0, worst_erf = 0;
    for (int i = 0; i <= 200000; i++) {
      const float x = -87.0f + 87.0f * static_cast<float>(i) / 200000.0f;  // the GPT's exp arguments are <= 0
      worst_exp = std::max(worst_exp, std::abs(exp_vec(x) - std::exp(static_cast<double>(x))) / std::exp(static_cast<double>(x)));
      const float z = -6.0f + 12.0f * static_cast<float>(i) / 200000.0f;
      worst_erf = std::max(worst_erf, std::abs(static_cast<double>(erf_vec(z)) - std::erf(static_cast<double>(z))));
    }
    MESSAGE("exp_vec: worst relative error " << worst_exp << "; erf_vec: worst absolute error " << worst_erf);
    CHECK(worst_exp < 2.5e-7);  // two float ulps
    // A&S 7.1.26's 1.5e-7, plus float's rounding of 1 - (a number near 1): torch's kernel computes it so.
    CHECK(worst_erf < 1e-6);
    CHECK(std::isnan(exp_vec(NAN)));
    CHECK(std::isnan(erf_vec(NAN)));
    CHECK(erf_vec(-0.5f) == -erf_vec(0.5f));
  }

  TEST_CASE("gpt specs: presets, nanoGPT's parameter count, and one sentence for each mistake") {
    const ModelSpec small = ModelSpec::parse("gpt2-124m");
    CHECK(small.str() == "gpt:layers=12,heads=12,embd=768,ctx=1024,vocab=50257");
    CHECK(small.num_params() == 124439808);  // GPT-2 small, the tied head counted once
    CHECK(ModelSpec::parse("gpt-tiny").str() == "gpt:layers=4,heads=4,embd=128,ctx=64");
    CHECK(ModelSpec::parse("gpt:ctx=8,embd=16,heads=2,layers=1,vocab=5").str() == "gpt:layers=1,heads=2,embd=16,ctx=8,vocab=5");
    CHECK(parse_error("gpt:layers=2,heads=3,embd=32,ctx=8") ==
          "model 'gpt:layers=2,heads=3,embd=32,ctx=8' has embd=32 and heads=3: the heads split the width evenly (nanoGPT asserts "
          "n_embd % n_head == 0); pick embd a multiple of heads");
    CHECK(parse_error("gpt:layers=2,heads=2,embd=32").rfind("model 'gpt:layers=2,heads=2,embd=32' does not give ctx; write it as gpt:", 0) == 0);
    CHECK(parse_error("gpt:layers=2,heads=2,embd=32,ctx=8,depth=3").rfind("model 'gpt:layers=2,heads=2,embd=32,ctx=8,depth=3' has 'depth=3' where", 0) == 0);
    CHECK(parse_error("gpt:layers=0,heads=2,embd=32,ctx=8") ==
          "model 'gpt:layers=0,heads=2,embd=32,ctx=8' has layers='0'; it must be a whole number from 1 to 1048576");
    CHECK(parse_error("gpt:layers=1,layers=2,heads=2,embd=32,ctx=8") == "model 'gpt:layers=1,layers=2,heads=2,embd=32,ctx=8' gives layers twice; give each once");
  }

  TEST_CASE("gpt parameters carry nanoGPT's state_dict names in named_parameters order") {
    GptSpec s{1, 2, 16, 8, 5};
    std::vector<std::string> names;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (const Parameter& p : gpt_parameters(s)) {
      names.push_back(p.name);
      ranges.push_back({p.offset, p.numel});
    }
    // Stored root first (wte, wpe, ln_f: FSDP's root unit is one range), then the blocks; no gaps.
    std::sort(ranges.begin(), ranges.end());
    int64_t next = 0;
    for (auto [at, n] : ranges) {
      CHECK(at == next);
      next = at + n;
    }
    CHECK(next == s.num_params());
    CHECK(gpt_parameters(s)[GptParamIndex::ln_f_bias(s)].offset == 5 * 16 + 8 * 16 + 16);
    CHECK(names == std::vector<std::string>{
                       "transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias",
                       "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias", "transformer.h.0.attn.c_proj.weight",
                       "transformer.h.0.attn.c_proj.bias", "transformer.h.0.ln_2.weight", "transformer.h.0.ln_2.bias",
                       "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.bias", "transformer.h.0.mlp.c_proj.weight",
                       "transformer.h.0.mlp.c_proj.bias", "transformer.ln_f.weight", "transformer.ln_f.bias"});
    // nanoGPT's init: ones and zeros for LayerNorm, zero biases, the residual projections narrower.
    const std::vector<float> v = gpt_init_values(s, 0);
    const std::vector<Parameter> ps = gpt_parameters(s);
    auto stddev = [&](int i) {
      double sq = 0;
      for (int64_t k = 0; k < ps[static_cast<size_t>(i)].numel; k++) sq += std::pow(v[static_cast<size_t>(ps[static_cast<size_t>(i)].offset + k)], 2);
      return std::sqrt(sq / static_cast<double>(ps[static_cast<size_t>(i)].numel));
    };
    using P = GptParamIndex;
    CHECK(v[static_cast<size_t>(ps[P::block(s, 0, P::Ln1W)].offset)] == 1.0f);
    CHECK(v[static_cast<size_t>(ps[P::block(s, 0, P::AttnB)].offset)] == 0.0f);
    CHECK(stddev(P::block(s, 0, P::AttnW)) == doctest::Approx(0.02).epsilon(0.1));
    CHECK(stddev(P::block(s, 0, P::FcProjW)) == doctest::Approx(0.02 / std::sqrt(2.0)).epsilon(0.1));
  }

  TEST_CASE("gpt backward equals finite differences of the loss, with the tied embedding's two uses summed") {
    ModelSpec spec = ModelSpec::parse("gpt:layers=2,heads=2,embd=8,ctx=4,vocab=6");
    Model m(spec, nullptr, 7);
    const int64_t B = 2, T = 4;
    const std::vector<int64_t> idx = {0, 3, 5, 1, 2, 2, 4, 0}, tgt = {3, 5, 1, 2, 2, 4, 0, 1};
    REQUIRE(static_cast<int64_t>(idx.size()) == B * T);
    m.zero_grad();
    gpt_loss(m, idx, tgt, B);
    std::vector<float> probs(static_cast<size_t>(B * T * 6)), dlogits(probs.size());
    cross_entropy_forward(probs.data(), m.forward_tokens(idx.data(), B), tgt.data(), B * T, 6);
    cross_entropy_backward(dlogits.data(), probs.data(), tgt.data(), B * T, 6, 1.0f / static_cast<float>(B * T));
    std::vector<int> order;
    m.backward(dlogits.data(), [&](int p) { order.push_back(p); });
    // Every parameter reported once, ln_f first, the tied wte last.
    CHECK(order.size() == m.parameters().size());
    CHECK(order.front() == GptParamIndex::ln_f_bias(spec.gpt));
    CHECK(order.back() == GptParamIndex::kWte);
    const std::vector<float> grads(m.grads(), m.grads() + m.num_params());
    // (h 1e-3: LayerNorm divides by a 0.02-wide spread, so larger steps leave the linear regime.)
    const test::FiniteDifferenceCheck fd = test::finite_differences(m, grads, [&] { return gpt_loss(m, idx, tgt, B); });
    MESSAGE(fd.checked << " gradients checked, worst relative difference " << fd.worst << " at " << fd.at);
    CHECK(fd.worst < 2e-2);
  }

  TEST_CASE("text data: the sorted characters are the vocabulary, a sample is T tokens and the next T") {
    const auto path = write_text("dtlab_gpt_text.txt", "hello world\nhello gpt\n");
    const Dataset ds = make_dataset("text:" + path.string(), 4, 0);
    CHECK(ds.is_tokens());
    CHECK(ds.chars == U"\n deghloprtw");
    CHECK(ds.num_classes == 12);
    CHECK(ds.n == (22 - 1) / 4);
    SamplerConfig sc;
    sc.n = ds.n;
    sc.shuffle = false;
    DistributedSampler sampler(sc);
    DataLoader loader(ds, sampler, 2, false);
    Batch b;
    REQUIRE(loader.next(b));
    CHECK(decode_tokens(ds.chars, std::vector<int32_t>(b.tok.begin(), b.tok.begin() + 8).data(), 8) == "hello wo");
    std::vector<int32_t> targets(b.y.begin(), b.y.end());
    CHECK(decode_tokens(ds.chars, targets.data(), 8) == "ello wor");
    const auto bad = write_text("dtlab_gpt_bad.txt", std::string("ok\xff\xfe"));
    CHECK(test::error_sentence([&] { make_dataset("text:" + bad.string(), 1, 0); }) ==
          "--data text:" + bad.string() + " is not UTF-8 text: byte 2 starts no valid character; convert it (iconv -t UTF-8) or pass another file");
    std::filesystem::remove(path);
    std::filesystem::remove(bad);
  }

  TEST_CASE("gpt under dp: DataParallel scatters whole samples and reduce-adds onto rank 0, equal to one rank of the whole batch") {
    TrainConfig one = gpt_config("single", 1, 2);
    one.batch = 8;
    one.drop_last = true;
    one.optimizer.kind = OptimizerKind::SGD;
    one.optimizer.lr = 0.1;
    Trainer ref(one);
    const TrainSummary rs = ref.run();
    TrainConfig c = one;
    c.strategy = Strategy::Dp;
    c.world_size = 2;
    c.batch = 4;  // per device: rank 0 loads 8
    Trainer t(c);
    const TrainSummary s = t.run();
    CHECK(test::max_abs_diff(t.model(), ref.model()) < 1e-6);
    CHECK(std::abs(s.eval_loss - rs.eval_loss) < 1e-6);
  }

  TEST_CASE("gpt under dp: coalesced groups that are not side by side in the flat buffer (ln_f beside the embeddings) still sum") {
    // Buffers of 4 KiB: the last group holds the last block and ln_f, which the flat buffer keeps
    // after wpe; it is flattened into a staging buffer, reduce-added, and unflattened on rank 0.
    const ModelSpec spec = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8,vocab=11");
    const int64_t B = 4, T = spec.gpt.ctx;
    std::vector<int64_t> idx(static_cast<size_t>(B * T));
    for (size_t i = 0; i < idx.size(); i++) idx[i] = static_cast<int64_t>((i * 7 + 3) % 11);
    Model whole(spec, nullptr, 2);
    whole.forward_tokens(idx.data(), B);
    const int64_t n = B * T * spec.gpt.vocab;
    std::vector<float> d(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; i++) d[static_cast<size_t>(i)] = 0.01f * static_cast<float>((i % 13) - 6);
    whole.backward(d.data());
    std::vector<float> got;
    ThreadsWorld w(2);
    w.run([&](int r, Communicator& comm, RankContext& ctx) {
      Model m(spec, nullptr, 2);
      DataParallel dp(m, comm, &ctx, DpOptions{4096});
      if (r == 0) {
        bool apart = false;
        for (const auto& g : dp.reduce_groups())
          for (size_t k = 1; k < g.size(); k++)
            apart |= m.parameters()[static_cast<size_t>(g[k])].offset != m.parameters()[static_cast<size_t>(g[k - 1])].offset + m.parameters()[static_cast<size_t>(g[k - 1])].numel;
        CHECK(apart);
      }
      if (r == 0) m.zero_grad();
      dp.forward_tokens(r == 0 ? idx.data() : nullptr, B);
      dp.backward(r == 0 ? d.data() : nullptr);
      if (r == 0) got.assign(m.grads(), m.grads() + m.num_params());
    });
    REQUIRE(static_cast<int64_t>(got.size()) == whole.num_params());
    float diff = 0;
    for (int64_t i = 0; i < whole.num_params(); i++) diff = std::max(diff, std::abs(got[static_cast<size_t>(i)] - whole.grads()[i]));
    CHECK(diff < 1e-6f);
  }

  TEST_CASE("gpt under fsdp: a root unit (embeddings, ln_f, the tied head) and one per block, equal to ddp") {
    const TrainConfig c = gpt_config("ddp", 2, 2);
    Trainer ddp(c);
    ddp.run();
    for (const char* sharding : {"full", "grad-op"}) {
      CAPTURE(sharding);
      TrainConfig f = c;
      f.strategy = Strategy::Fsdp;
      f.fsdp.sharding = parse_sharding(sharding);
      Trainer fsdp(f);
      fsdp.run();
      CHECK(test::max_abs_diff(fsdp.model(), ddp.model()) < 1e-6);
    }
  }

  TEST_CASE("gpt pipeline: GPipe, 1F1B, interleaved and ZB-H1 stages equal one rank, the tied weight summed over the embedding group") {
    // Blocks cut over the stages, wte and wpe on the first, ln_f and lm_head's copy of wte on the
    // last; their two gradients summed once per step over Megatron's embedding group. The sanitizer
    // runs (quick) take AdamW only: the same code paths, half of this case's 48 s under ASan.
    for (OptimizerKind opt : optimizers_to_run()) {
      TrainConfig one = gpt_config("single", 1, 4);
      one.optimizer.kind = opt;
      Trainer ref(one);
      const TrainSummary rs = ref.run();
      struct Case {
        const char* schedule;
        int p, v, m;
      };
      for (const Case& k : {Case{"gpipe", 2, 1, 2}, Case{"1f1b", 2, 1, 4}, Case{"1f1b", 4, 1, 2}, Case{"interleaved", 2, 2, 4},
                            Case{"interleaved", 1, 2, 2}, Case{"zb-h1", 2, 1, 4}}) {
        CAPTURE(k.schedule);
        CAPTURE(k.p);
        CAPTURE(k.v);
        TrainConfig c = one;
        c.strategy = Strategy::Pipeline;
        c.world_size = k.p;
        c.pipeline.stages = k.p;
        c.pipeline.chunks = k.v;
        c.pipeline.microbatches = k.m;
        c.pipeline.schedule = parse_schedule_kind(k.schedule);
        Trainer t(c);
        const TrainSummary s = t.run();
        CHECK(test::max_abs_diff(t.model(), ref.model()) < 1e-5);
        CHECK(std::abs(s.eval_loss - rs.eval_loss) < 1e-5);
        if (opt != OptimizerKind::AdamW || k.p == 1) continue;
        const int64_t tied_bytes = t.model().spec().gpt.vocab * 16 * 4;
        for (int rank = 0; rank < k.p; rank++) {
          CAPTURE(rank);
          int tied = 0;
          for (const Event& e : t.recorder().events(rank))
            tied += e.kind == EventKind::Collective && e.iteration == 1 && e.coll.op == CollectiveOp::AllReduce && e.coll.bytes == tied_bytes;
          CHECK(tied == (rank == 0 || rank == k.p - 1 ? 1 : 0));
        }
      }
    }
  }

  TEST_CASE("gpt pipeline with --dp 2 equals ddp on 2 ranks: each replica's embedding group, its own") {
    const TrainConfig d = gpt_config("ddp", 2, 2);
    TrainConfig c = d;
    c.strategy = Strategy::Pipeline;
    c.world_size = 4;
    c.pipeline.stages = 2;
    c.pipeline.dp = 2;
    c.pipeline.microbatches = 2;
    c.activation_checkpointing = true;  // per block inside each stage: the same gradients
    c.clip_grad_norm = 0.5;             // lm_head's copy stays out of the norm: wte counts once
    TrainConfig dc = d;
    dc.clip_grad_norm = 0.5;
    Trainer clipped(dc);
    clipped.run();
    Trainer t(c);
    t.run();
    CHECK(test::max_abs_diff(t.model(), clipped.model()) < 1e-5);
    std::set<std::string> groups;
    for (const Event& e : t.recorder().all_events())
      if (e.kind == EventKind::Collective && e.coll.group != 0) groups.insert(t.recorder().label(e.coll.group - 1));
    CHECK(groups == std::set<std::string>{"dp0: 0,2", "dp1: 1,3", "emb0: 0,1", "emb1: 2,3"});
    // ZB-H1: each B split into I (input gradients) and W (the Linears' weight gradients, a
    // checkpointed block's forward run once more first), the same step.
    TrainConfig zb = c;
    zb.pipeline.schedule = ScheduleKind::ZBH1;
    Trainer z(zb);
    z.run();
    CHECK(test::max_abs_diff(z.model(), clipped.model()) < 1e-5);
  }

  TEST_CASE("gpt tensor parallel: heads and MLP columns over 2 and 4 ranks, sequence parallel and recomputed, equal one rank") {
    // Megatron's split of every block (c_attn and c_fc column-parallel, the c_projs row-parallel) on
    // one replica of t ranks: the gathered shards equal the one-rank model, and every TP collective
    // of an iteration is gpt_tp_collectives()' list, in its order and with its bytes.
    for (OptimizerKind opt : optimizers_to_run()) {
      TrainConfig one = gpt_config("single", 1, 2);
      one.model = ModelSpec::parse("gpt:layers=2,heads=4,embd=16,ctx=8");
      one.optimizer.kind = opt;
      one.optimizer.lr = 1e-3;
      Trainer ref(one);
      const TrainSummary rs = ref.run();
      struct Case {
        int t;
        bool sp, recompute;
      };
      // The sanitizer runs (quick) take the plain split and the one with every option.
      std::vector<Case> cases = {Case{2, false, false}, Case{4, true, true}};
      if (!test::quick()) cases.insert(cases.begin() + 1, {Case{4, false, false}, Case{2, true, false}});
      for (const Case& k : cases) {
        CAPTURE(k.t);
        CAPTURE(k.sp);
        CAPTURE(k.recompute);
        TrainConfig c = one;
        c.strategy = Strategy::Ddp;
        c.world_size = c.tp = k.t;
        c.sequence_parallel = k.sp;
        c.activation_checkpointing = k.recompute;
        Trainer t(c);
        const TrainSummary s = t.run();
        // The partial sums are added in another order than one rank's matmul adds them (SGD: 4e-9
        // apart). AdamW divides by sqrt(v), so a gradient that is rounding noise around zero (the key
        // bias's: a constant added to every key leaves the softmax unchanged) moves its parameter by up
        // to lr either way: nanoGPT's shakespeare_char lr, 1e-3, keeps that within the acceptance's 1e-4.
        CHECK(test::max_abs_diff(t.result_model(), ref.model()) < 1e-4);
        CHECK(std::abs(s.eval_loss - rs.eval_loss) < 1e-5);
        if (opt != OptimizerKind::AdamW) continue;
        const GptSpec& g = t.model().spec().gpt;
        const std::vector<TpCollective> want =
            gpt_tp_collectives(g, GptRange::all(g), TensorParallelSpec{k.t, 0, k.sp}, c.batch, k.recompute);
        for (int rank = 0; rank < k.t; rank++) {
          CAPTURE(rank);
          const std::vector<Event> events = t.recorder().events(rank);  // a copy: `got` points into it
          std::vector<const Event*> got;
          for (const Event& e : events)
            if (e.kind == EventKind::Collective && e.iteration == 1 && e.coll.dtype == DType::F32) got.push_back(&e);
          // Then the step's figures (loss, correct, samples, overlap) summed over the ranks: 4 floats.
          REQUIRE(got.size() == want.size() + 1);
          CHECK(got.back()->coll.bytes == 16);
          for (size_t i = 0; i < want.size(); i++) {
            CAPTURE(i);
            CAPTURE(want[i].what);
            CHECK(got[i]->coll.op == want[i].op);
            CHECK(got[i]->coll.bytes == want[i].bytes);
            CHECK(got[i]->coll.group_size == k.t);
          }
        }
      }
    }
  }

  TEST_CASE("gpt on the 2 x 2 x 2 mesh: dp, pp and tp together equal ddp on 2 ranks, and so do fsdp and sequence parallel on dp x tp") {
    TrainConfig d = gpt_config("ddp", 2, 2);
    d.model = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8");
    Trainer ddp(d);
    const TrainSummary ds = ddp.run();
    TrainConfig mesh = d;
    mesh.strategy = Strategy::Pipeline;
    mesh.world_size = 8;
    mesh.tp = 2;
    mesh.pipeline.stages = 2;
    mesh.pipeline.dp = 2;
    mesh.pipeline.microbatches = 2;
    TrainConfig fsdp = d;
    fsdp.strategy = Strategy::Fsdp;
    fsdp.world_size = 4;
    fsdp.tp = 2;
    fsdp.sequence_parallel = true;
    // Megatron's usual layout: the stages send each TP rank's positions (sequence parallel), ZB-H1
    // splits each backward, and every block is recomputed.
    TrainConfig sp = mesh;
    sp.sequence_parallel = true;
    sp.pipeline.schedule = ScheduleKind::ZBH1;
    sp.activation_checkpointing = true;
    std::vector<TrainConfig> runs = {sp};  // the sanitizer runs (quick): the mesh with every option
    if (!test::quick()) runs = {mesh, fsdp, sp};
    for (const TrainConfig& c : runs) {
      CAPTURE(strategy_name(c.strategy));
      Trainer t(c);
      const TrainSummary s = t.run();
      CHECK(test::max_abs_diff(t.result_model(), ddp.model()) < 1e-5);
      CHECK(std::abs(s.eval_loss - ds.eval_loss) < 1e-5);
    }
    // Which heads and MLP columns each rank holds, as the run's header says it.
    Trainer t(mesh);
    const std::vector<std::string> lines = t.describe_mesh_lines();
    CHECK(std::find(lines.begin(), lines.end(),
                    "  rank 3: dp 0, pp 1, tp 1 -- stage 1 (block 1, ln_f and the head), TP shard 1 of 2: heads 1, MLP columns 32-63, "
                    "replica 0 of 2") != lines.end());
  }

  TEST_CASE("gpt activations: the tracker holds the engine's count, and Korthikanti's terms sum to sbh(34 + 5as/h)") {
    const ModelSpec spec = ModelSpec::parse("gpt:layers=3,heads=2,embd=16,ctx=8,vocab=11");
    const GptSpec& g = spec.gpt;
    for (int64_t B : {1, 3}) {
      CAPTURE(B);
      for (bool ckpt : {false, true}) {
        CAPTURE(ckpt);
        MemoryTracker mem;
        Model m(spec, &mem, 0);
        m.set_activation_checkpointing(ckpt);
        const std::vector<int64_t> idx(static_cast<size_t>(B * g.ctx), 5);
        m.forward_tokens(idx.data(), B);
        CHECK(mem.stats().current_of(MemCategory::Activations) == gpt_activation_bytes(g, B, ckpt));
        // In 16 bits (--precision): 2 bytes an activation, LayerNorm's statistics and the logits'
        // float32 copy 4.
        MemoryTracker hmem;
        Model hm(spec, &hmem, 0);
        hm.set_precision(Precision::BF16);
        hm.set_activation_checkpointing(ckpt);
        hm.forward_tokens(idx.data(), B);
        CHECK(hmem.stats().current_of(MemCategory::Activations) == gpt_activation_bytes(g, B, ckpt, {}, 2));
        // LoRA on c_attn adds its scratch, once for the model.
        MemoryTracker lmem;
        Model lm(spec, &lmem, 0);
        LoraSpec lora;
        lora.rank = 3;
        lm.enable_lora(lora, 0);
        lm.set_activation_checkpointing(ckpt);
        lm.forward_tokens(idx.data(), B);
        CHECK(lmem.stats().current_of(MemCategory::Activations) == gpt_activation_bytes(g, B, ckpt) + gpt_lora_activation_bytes(g, lora, B));
      }
      double korthikanti = 0;
      int64_t engine = 0;
      for (const GptActivationTerm& t : gpt_block_activation_terms(g, B)) {
        CAPTURE(t.tensor);
        korthikanti += t.korthikanti;
        engine += t.engine;
        // Where both keep the tensor, float32 is twice Megatron's 16 bits; elsewhere the row says why.
        if (t.why.empty()) CHECK(static_cast<double>(t.engine) == 2 * t.korthikanti);
        else CHECK(static_cast<double>(t.engine) != 2 * t.korthikanti);
      }
      CHECK(korthikanti == layer_activation_bytes(g.ctx, B, g.embd, static_cast<int>(g.heads)));
      CHECK(korthikanti == 8.0 * B * 16 * (34 + 5.0 * 2 * 8 / 16));  // s·b·h·(34 + 5·a·s/h)
      CHECK(engine == gpt_block_activation_bytes(g, B));
      // A TP shard of 2: the heads' and MLP columns' tensors halve; under sequence parallelism the
      // LayerNorm regions' too (Korthikanti's Table 2).
      for (bool sp : {false, true}) {
        CAPTURE(sp);
        const TensorParallelSpec tp{2, 1, sp};
        for (bool ckpt : {false, true}) {
          CAPTURE(ckpt);
          MemoryTracker mem;
          Model m(spec, &mem, 0, 0, static_cast<int>(g.layers) + 2, cpu_device(), tp);
          EchoTpComm comm;
          m.set_tensor_parallel_comm(&comm);
          m.set_activation_checkpointing(ckpt);
          const std::vector<int64_t> idx(static_cast<size_t>(B * g.ctx), 5);
          m.forward_tokens(idx.data(), B);
          CHECK(mem.stats().current_of(MemCategory::Activations) == gpt_activation_bytes(g, B, ckpt, tp));
          MemoryTracker hmem;
          Model hm(spec, &hmem, 0, 0, static_cast<int>(g.layers) + 2, cpu_device(), tp);
          hm.set_tensor_parallel_comm(&comm);
          hm.set_activation_checkpointing(ckpt);
          hm.set_precision(Precision::FP16);
          hm.forward_tokens(idx.data(), B);
          CHECK(hmem.stats().current_of(MemCategory::Activations) == gpt_activation_bytes(g, B, ckpt, tp, 2));
        }
        double k2 = 0;
        for (const GptActivationTerm& t : gpt_block_activation_terms(g, B, tp)) k2 += t.korthikanti;
        const double sbh = 8.0 * B * 16, as_h = 5.0 * 2 * 8 / 16;
        CHECK(k2 == doctest::Approx(sp ? sbh / 2 * (34 + as_h) : sbh * (10 + 24.0 / 2 + as_h / 2)));
      }
    }
  }

  TEST_CASE("gpt activation checkpointing per block: the same weights bit for bit, fewer activation bytes") {
    for (const char* strategy : {"ddp", "fsdp"}) {
      CAPTURE(strategy);
      TrainConfig c = test::demo_config(strategy, 2, 4, 3);
      c.model = ModelSpec::parse("gpt:layers=3,heads=2,embd=16,ctx=8");
      c.data = "text";
      c.eval_samples = 256;  // (the final evaluation: the whole text is 12k samples, most of a test run)
      Trainer plain(c);
      const TrainSummary a = plain.run();
      c.activation_checkpointing = true;
      Trainer ckpt(c);
      const TrainSummary b = ckpt.run();
      CHECK(test::max_abs_diff(ckpt.model(), plain.model()) == 0.0);
      const auto acts = [](const TrainSummary& s) { return s.memory.peak[static_cast<size_t>(MemCategory::Activations)]; };
      MESSAGE(std::string(strategy) << ": activations " << acts(a) << " B without, " << acts(b) << " B with checkpointing");
      CHECK(acts(b) < acts(a));
    }
  }

  TEST_CASE("dtlab-cli: a GPT reads the shipped text unless --data names other text, and refuses points") {
    const test::CliResult ok = test::run_cli({"train", "--model", "gpt:layers=1,heads=2,embd=16,ctx=8", "--steps", "1", "--batch", "2"});
    CHECK(ok.code == 0);
    CHECK(test::contains(ok.out, "tokens/s"));
    const test::CliResult pts = test::run_cli({"train", "--model", "gpt:layers=1,heads=2,embd=16,ctx=8", "--data", "spiral", "--steps", "1"});
    CHECK(pts.code == 2);
    CHECK(pts.err ==
          "dtlab-cli: --model gpt:layers=1,heads=2,embd=16,ctx=8 reads tokens, but spiral:classes=3,points=1000,noise=0.1,seed=0 holds "
          "points; use --data text (the shipped text), text:PATH, or a .npz holding tokens\n");
    const test::CliResult empty = test::run_cli({"generate", "--init", DTLAB_SOURCE_DIR "/README.md"});
    CHECK(empty.code == 2);
  }

  TEST_CASE("gpt lora: adapters on c_attn with peft's names, the base frozen, and fsdp, recompute and tp equal ddp") {
    TrainConfig c = gpt_config("ddp", 2, 2);
    c.lora.rank = 4;
    c.lora.alpha = 8.0f;
    Trainer ddp(c);
    ddp.run();
    const Model& m = ddp.model();
    REQUIRE(m.lora());
    const std::vector<Parameter>& ps = m.parameters();
    REQUIRE(ps.size() == 4);
    CHECK(ps[0].name == "transformer.h.0.attn.c_attn.lora_A.weight");
    CHECK(ps[0].shape == Shape{4, 16});
    CHECK(ps[1].name == "transformer.h.0.attn.c_attn.lora_B.weight");
    CHECK(ps[1].shape == Shape{48, 4});
    CHECK(ps[3].name == "transformer.h.1.attn.c_attn.lora_B.weight");
    // The base did not move; c_attn's merged weight is W + (alpha / r) B A.
    const Model start(m.spec(), nullptr, c.seed);  // rank 0's base: the seed's values
    const std::vector<float> base = start.host_params(), merged = m.merged_params();
    REQUIRE(merged.size() == base.size());
    const std::vector<Parameter> whole = gpt_parameters(m.spec().gpt);
    int moved = 0, changed_elsewhere = 0;
    for (const Parameter& p : whole)
      for (int64_t i = 0; i < p.numel; i++) {
        const bool differs = merged[static_cast<size_t>(p.offset + i)] != base[static_cast<size_t>(p.offset + i)];
        if (p.name.ends_with("attn.c_attn.weight")) moved += differs;
        else changed_elsewhere += differs;
      }
    CHECK(moved > 0);
    CHECK(changed_elsewhere == 0);
    // FSDP (a unit per adapted block), recomputation per block, and TP 2 (B's rows split by heads, A's
    // gradient all-reduced) give ddp's adapters.
    const std::vector<float> want = m.host_params();
    for (int variant = 0; variant < 3; variant++) {
      CAPTURE(variant);
      TrainConfig v = c;
      if (variant == 0) v.strategy = Strategy::Fsdp;
      if (variant == 1) v.activation_checkpointing = true;
      if (variant == 2) v.tp = 2, v.world_size = 4;
      Trainer t(v);
      t.run();
      CHECK(test::max_abs_diff(t.result_model().merged_params(), merged) < 1e-6);
      if (variant < 2) CHECK(test::max_abs_diff(t.model().host_params(), want) < 1e-6);
    }
    TrainConfig bad = c;
    bad.lora.layers = {2};
    CHECK(test::error_of(bad) == "--lora-layers names block 2, which is not a block of gpt:layers=2,heads=2,embd=16,ctx=8; its blocks are "
                                 "0 to 1 (the adapters sit on each listed block's attn.c_attn)");
  }

  TEST_CASE("gpt runs: ddp trains it, and what does not fit it is refused with its sentence") {
    TrainConfig c = test::demo_config("ddp", 2, 4, 3);
    c.model = ModelSpec::parse("gpt:layers=1,heads=2,embd=16,ctx=8");
    c.data = "text";
    c.eval_samples = 256;  // (the final evaluation: the whole text is 12k samples, most of a test run)
    Trainer t(c);
    const TrainSummary s = t.run();
    CHECK(s.steps == 3);
    CHECK(std::isfinite(s.eval_loss));
    CHECK(t.model().spec().gpt.vocab == 62);  // the shipped sonnets' characters
    TrainConfig tp = c;
    tp.tp = 3;
    tp.world_size = 3;
    CHECK(test::error_of(tp) ==
          "--tp 3 gives each rank whole attention heads, but gpt:layers=1,heads=2,embd=16,ctx=8 has 2 heads, which do not divide by 3; "
          "use a --tp that divides heads=2");
    TrainConfig seq = c;
    seq.model = ModelSpec::parse("gpt:layers=1,heads=4,embd=16,ctx=6");
    seq.tp = seq.world_size = 4;
    seq.sequence_parallel = true;
    CHECK(test::error_of(seq) ==
          "--sequence-parallel gives each of the --tp 4 ranks an equal run of every sample's 6 positions, which do not divide by 4; "
          "use a --tp that divides ctx=6");
    TrainConfig pts = c;
    pts.data = "blobs";
    CHECK(test::error_of(pts) ==
          "--model gpt:layers=1,heads=2,embd=16,ctx=8 reads tokens, but blobs:dim=8,classes=3,points=500,spread=1,seed=0 holds points; "
          "use --data text (the shipped text), text:PATH, or a .npz holding tokens");
  }
}

}  // namespace dtlab
