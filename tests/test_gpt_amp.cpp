// The GPT under torch.autocast (--amp; GptCore::set_amp): which tensors autocast makes 16-bit, bit
// for bit; every strategy and mesh dimension against one autocast rank; the collectives that move a
// 16-bit tensor move 2 bytes an element. tests/gpt_amp_torch.py holds it to torch.autocast itself.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/gpt.h"
#include "engine/core/half.h"
#include "engine/core/ops.h"
#include "engine/train/train.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

namespace dtlab {

namespace {

// How many of x's n values a bf16 holds exactly.
int64_t bf16_values(const float* x, int64_t n) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) k += round_to_half(x[i], HalfFormat::BF16) == x[i];
  return k;
}

// A small GPT on the shipped text, SGD with momentum (its step is linear in the gradient, so a
// rounding difference stays rounding-sized), batch 4, 3 steps, under --amp bf16.
TrainConfig amp_config(const std::string& model = "gpt:layers=2,heads=4,embd=16,ctx=8") {
  TrainConfig c = test::demo_config("single", 1, 4, 3);
  c.model = ModelSpec::parse(model);
  c.data = "text";
  c.eval_samples = 256;
  c.optimizer = default_optimizer_config(OptimizerKind::SGD);
  c.optimizer.lr = 0.1;
  c.optimizer.momentum = 0.9;
  c.amp = Precision::BF16;
  return c;
}

// Iteration 1's collectives of `rank` in `dtype`: their bytes, in order.
std::vector<int64_t> bytes_of(Trainer& t, int rank, CollectiveOp op, DType dtype) {
  std::vector<int64_t> out;
  for (const Event& e : t.recorder().events(rank))
    if (e.kind == EventKind::Collective && e.iteration == 1 && e.coll.op == op && e.coll.dtype == dtype) out.push_back(e.coll.bytes);
  return out;
}

}  // namespace

TEST_SUITE("gpt") {
  TEST_CASE("gpt under autocast: the matmuls' outputs and the Linear gradients are bf16 values, LayerNorm's and the residual's are not") {
    const ModelSpec spec = ModelSpec::parse("gpt:layers=2,heads=2,embd=16,ctx=8,vocab=11");
    const int64_t B = 3, T = 8, V = 11, BT = B * T;
    std::vector<int64_t> idx(static_cast<size_t>(BT)), tgt(idx.size());
    for (int64_t i = 0; i < BT; i++) {
      idx[static_cast<size_t>(i)] = (i * 7 + 3) % V;
      tgt[static_cast<size_t>(i)] = (i * 5 + 1) % V;
    }
    for (bool amp : {false, true}) {
      CAPTURE(amp);
      Model m(spec, nullptr, 7);
      if (amp) m.set_amp(Precision::BF16);
      CHECK(m.param_dtype() == DType::F32);  // autocast keeps the parameters float32
      CHECK_FALSE(m.half_acts());            // and the residual stream between stages
      m.zero_grad();
      const float* logits = m.forward_tokens(idx.data(), B);
      // lm_head's output and the attention probabilities: 16-bit under autocast; the last block's
      // output (x + mlp(ln_2(x)), a float32 add) is not.
      CHECK((bf16_values(logits, BT * V) == BT * V) == amp);
      std::vector<float> att;
      REQUIRE(m.gpt()->attention(1, 2, 1, att));
      CHECK((bf16_values(att.data(), T * T) == T * T) == amp);
      const Tensor& out = m.gpt()->output();
      CHECK(bf16_values(out.f32(), out.numel()) < out.numel() / 2);
      std::vector<float> probs(static_cast<size_t>(BT * V)), dlogits(probs.size());
      cross_entropy_forward(probs.data(), logits, tgt.data(), BT, V);
      cross_entropy_backward(dlogits.data(), probs.data(), tgt.data(), BT, V, 1.0f / static_cast<float>(BT));
      m.backward(dlogits.data(), {});
      // Each Linear's weight and bias gradient comes out of its bf16 backward rounded once and is
      // widened into the float32 .grad; LayerNorm's and wpe's are float32 sums; wte's adds lm_head's
      // bf16 share to the embedding's float32 one.
      for (const Parameter& p : m.parameters()) {
        CAPTURE(p.name);
        const int64_t exact = bf16_values(p.grad, p.numel);
        const bool linear = p.name.find("c_attn") != std::string::npos || p.name.find("c_proj") != std::string::npos ||
                            p.name.find("c_fc") != std::string::npos;
        if (linear) CHECK((exact == p.numel) == amp);
        else CHECK(exact < p.numel);
      }
    }
  }

  TEST_CASE("autocast's attention: q k^T and the scaling rounded apart, and att v reads the rounded probabilities") {
    // nanoGPT's unfused attention under autocast: att = softmax(round(round(q k^T) * scale)) rounded,
    // then y = att v from that att (what the backward differentiates).
    const int64_t B = 1, T = 5, C = 8, NH = 2, hs = C / NH;
    std::vector<float> qkv(static_cast<size_t>(B * T * 3 * C));
    for (size_t i = 0; i < qkv.size(); i++) qkv[i] = round_to_half(std::sin(0.37f * static_cast<float>(i)) * 1.3f, HalfFormat::BF16);
    std::vector<float> out(static_cast<size_t>(B * T * C)), att(static_cast<size_t>(B * NH * T * T));
    const HalfFormat bf = HalfFormat::BF16;
    cpu_device().attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, &bf);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    for (int64_t h = 0; h < NH; h++)
      for (int64_t t = 0; t < T; t++) {
        // The row's scores as torch rounds them, then its softmax in float, rounded.
        std::vector<float> z(static_cast<size_t>(t + 1));
        for (int64_t u = 0; u <= t; u++) {
          float dot = 0;
          for (int64_t d = 0; d < hs; d++) dot += qkv[static_cast<size_t>(t * 3 * C + h * hs + d)] * qkv[static_cast<size_t>(u * 3 * C + C + h * hs + d)];
          z[static_cast<size_t>(u)] = round_to_half(round_to_half(dot, bf) * scale, bf);
        }
        const float mx = *std::max_element(z.begin(), z.end());
        double sum = 0;
        for (float v : z) sum += std::exp(static_cast<double>(v - mx));
        for (int64_t u = 0; u < T; u++) {
          const float got = att[static_cast<size_t>((h * T + t) * T + u)];
          CHECK(round_to_half(got, bf) == got);
          if (u > t) CHECK(got == 0.0f);
          else CHECK(got == doctest::Approx(std::exp(static_cast<double>(z[static_cast<size_t>(u)] - mx)) / sum).epsilon(1e-2));
        }
        for (int64_t d = 0; d < hs; d++) {  // y = att v, from the rounded probabilities
          double y = 0;
          for (int64_t u = 0; u <= t; u++)
            y += double(att[static_cast<size_t>((h * T + t) * T + u)]) * qkv[static_cast<size_t>(u * 3 * C + 2 * C + h * hs + d)];
          CHECK(out[static_cast<size_t>(t * C + h * hs + d)] == doctest::Approx(y).epsilon(1e-6));
        }
      }
  }

  TEST_CASE("gpt under autocast: every strategy, TP, SP, recompute, CP, LoRA and the experts equal one autocast rank within bf16 rounding") {
    // The same batches as one rank (one replica), or as DDP (two); held at each tensor's scale to the
    // reference's distance from its float32 run (test::differs_at_tensor_scale).
    const TrainConfig one = amp_config();
    Trainer ref(one);
    const TrainSummary rs = ref.run();
    TrainConfig exact = one;
    exact.amp = Precision::FP32;
    Trainer ref32(exact);
    ref32.run();
    CHECK(std::isfinite(rs.eval_loss));
    // Autocast's bytes per parameter: float32 parameters and gradients, no master copy.
    const int64_t P = ref.model().num_params();
    CHECK(rs.memory.peak[static_cast<size_t>(MemCategory::Parameters)] == 4 * P);
    CHECK(rs.memory.peak[static_cast<size_t>(MemCategory::Gradients)] == 4 * P);
    CHECK(rs.memory.peak[static_cast<size_t>(MemCategory::MasterWeights)] == 0);
    struct Case {
      const char* what;
      void (*set)(TrainConfig&);
    };
    std::vector<Case> same = {
        {"tp 2 + sp, recompute",
         [](TrainConfig& c) {
           c.strategy = Strategy::Ddp;
           c.world_size = c.tp = 2;
           c.sequence_parallel = c.activation_checkpointing = true;
         }},
        {"pipeline zb-h1",
         [](TrainConfig& c) {
           c.strategy = Strategy::Pipeline;
           c.world_size = c.pipeline.stages = 2;
           c.pipeline.microbatches = 2;
           c.pipeline.schedule = parse_schedule_kind("zb-h1");
         }},
        {"cp 2 ring",
         [](TrainConfig& c) {
           c.strategy = Strategy::Ddp;
           c.world_size = c.cp = 2;
         }},
    };
    if (!test::quick())
      same.insert(same.end(), {{"tp 2",
                                [](TrainConfig& c) {
                                  c.strategy = Strategy::Ddp;
                                  c.world_size = c.tp = 2;
                                }},
                               {"pipeline 1f1b",
                                [](TrainConfig& c) {
                                  c.strategy = Strategy::Pipeline;
                                  c.world_size = c.pipeline.stages = 2;
                                  c.pipeline.microbatches = 2;
                                  c.pipeline.schedule = parse_schedule_kind("1f1b");
                                }},
                               {"cp 2 ulysses",
                                [](TrainConfig& c) {
                                  c.strategy = Strategy::Ddp;
                                  c.world_size = c.cp = 2;
                                  c.cp_layout = CpLayout::Ulysses;
                                }},
                               {"cp 2 zigzag + tp 2 + sp",
                                [](TrainConfig& c) {
                                  c.strategy = Strategy::Ddp;
                                  c.world_size = 4;
                                  c.cp = c.tp = 2;
                                  c.sequence_parallel = true;
                                  c.cp_layout = CpLayout::Zigzag;
                                }}});
    for (const Case& k : same) {
      CAPTURE(k.what);
      TrainConfig c = one;
      k.set(c);
      Trainer t(c);
      const TrainSummary s = t.run();
      CHECK(test::differs_at_tensor_scale(ref.model().spec(), t.result_model().host_params(), ref.model().host_params(),
                                          ref32.model().host_params(), 1.6e-2) == "");
      CHECK(s.eval_loss == doctest::Approx(rs.eval_loss).epsilon(1e-2));
    }
    // Two replicas: DDP against FSDP and DataParallel.
    TrainConfig d = one;
    d.strategy = Strategy::Ddp;
    d.world_size = 2;
    Trainer ddp(d);
    ddp.run();
    TrainConfig d32 = d;
    d32.amp = Precision::FP32;
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
                                          ddp32.model().host_params(), 1.6e-2) == "");
    }
    // LoRA: the adapters' matmuls under autocast too; DDP's buckets against one rank's.
    TrainConfig lo = one;
    lo.lora.rank = 4;
    Trainer lone(lo);
    lone.run();
    TrainConfig lo32 = lo;
    lo32.amp = Precision::FP32;
    Trainer lone32(lo32);
    lone32.run();
    TrainConfig lt = lo;
    lt.strategy = Strategy::Ddp;
    lt.world_size = lt.tp = 2;
    Trainer ltp(lt);
    ltp.run();
    CHECK(test::max_abs_diff(ltp.result_model().merged_params(), lone.model().merged_params()) <=
          2 * test::max_abs_diff(lone32.model().merged_params(), lone.model().merged_params()) + 1e-6);
    // The experts: ddp on 2 ranks with each rank holding half of them (--ep 2) against all on each.
    TrainConfig e = d;
    e.moe = MoeSpec::parse("experts=4,top_k=2");
    Trainer dense(e);
    dense.run();
    TrainConfig e32 = e;
    e32.amp = Precision::FP32;
    Trainer dense32(e32);
    dense32.run();
    TrainConfig ep = e;
    ep.ep = 2;
    Trainer split(ep);
    split.run();
    CHECK(test::differs_at_tensor_scale(dense.model().spec(), split.result_model().host_params(), dense.model().host_params(),
                                        dense32.model().host_params(), 1.6e-2) == "");
    // Recompute runs the same 16-bit ops again: bit for bit.
    TrainConfig r = d;
    r.activation_checkpointing = true;
    Trainer rec(r);
    rec.run();
    CHECK(test::max_abs_diff(rec.model().host_params(), ddp.model().host_params()) == 0.0);
  }

  TEST_CASE("gpt under autocast: TP's sums, SP's gradient gathers, CP's K/V blocks and EP's combine move 2 bytes an element") {
    // B 4, T 8, C 16: a block's row-parallel output is 4 x 8 x 16 elements.
    const int64_t out = 4 * 8 * 16;
    TrainConfig c = amp_config();
    c.strategy = Strategy::Ddp;
    c.world_size = c.tp = 2;
    c.steps = 2;
    {
      Trainer t(c);
      t.run();
      for (int rank = 0; rank < 2; rank++) {
        CAPTURE(rank);
        // attn.c_proj's and mlp.c_proj's partial sums, two blocks: bf16; f's backward (the LayerNorm
        // outputs' gradients, widened by the cast's backward) stays float32.
        CHECK(bytes_of(t, rank, CollectiveOp::AllReduce, DType::BF16) == std::vector<int64_t>(4, out * 2));
        CHECK(bytes_of(t, rank, CollectiveOp::AllReduce, DType::F32).size() >= 4);
      }
    }
    c.sequence_parallel = true;
    {
      Trainer t(c);
      t.run();
      for (int rank = 0; rank < 2; rank++) {
        CAPTURE(rank);
        CHECK(bytes_of(t, rank, CollectiveOp::ReduceScatter, DType::BF16) == std::vector<int64_t>(4, out * 2));
        CHECK(bytes_of(t, rank, CollectiveOp::AllGather, DType::BF16) == std::vector<int64_t>(4, out * 2));
      }
    }
    // Ring attention, cp 2: each K/V block (B x T/2 x 2C) and each dK/dV block, in bf16.
    TrainConfig r = amp_config("gpt:layers=2,heads=4,embd=16,ctx=16");
    r.strategy = Strategy::Ddp;
    r.world_size = r.cp = 2;
    r.steps = 2;
    {
      Trainer t(r);
      t.run();
      for (int rank = 0; rank < 2; rank++) {
        CAPTURE(rank);
        // Per block: one K/V send forward, one K/V and one dK/dV send backward.
        CHECK(bytes_of(t, rank, CollectiveOp::Send, DType::BF16) == std::vector<int64_t>(6, 4 * 8 * 32 * 2));
        CHECK(bytes_of(t, rank, CollectiveOp::Send, DType::F32).empty());
      }
    }
    // Experts over 2 ranks: the dispatch sends the LayerNorm's float32 rows, the combine returns the
    // experts' bf16 outputs; backward the other way round.
    TrainConfig e = amp_config();
    e.strategy = Strategy::Ddp;
    e.world_size = e.ep = 2;
    e.moe = MoeSpec::parse("experts=4,top_k=2");
    e.steps = 2;
    Trainer t(e);
    t.run();
    for (int rank = 0; rank < 2; rank++) {
      CAPTURE(rank);
      // Per block: forward the combine, backward the output gradients' dispatch.
      CHECK(bytes_of(t, rank, CollectiveOp::AllToAll, DType::BF16).size() == 4);
      // The token counts (int64) aside, the inputs forward and their gradients backward.
      CHECK(bytes_of(t, rank, CollectiveOp::AllToAll, DType::F32).size() == 4);
    }
  }
}

}  // namespace dtlab
