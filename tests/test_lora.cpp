// LoRA (engine/core/lora.cpp; issue 17): the adapters are the model's only parameters, so gradients,
// DDP's buckets, FSDP's reduce-scatters and AdamW's state cover 4 x r x (in + out) bytes per adapted
// Linear; the adapter gradients equal an independent computation through the merged weights; B = 0
// leaves the base model's logits; the frozen base never changes; the saved files.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/core/model.h"
#include "engine/io/checkpoint.h"
#include "engine/io/safetensors.h"
#include "engine/train/train.h"
#include "tests/test_util.h"
#include "tests/train_util.h"

using namespace dtlab;

namespace {

LoraSpec lora(int r, std::vector<int> layers = {}) {
  LoraSpec l;
  l.rank = r;
  l.layers = std::move(layers);
  return l;
}

// 4 x r x (in + out) summed over the adapted Linears of `spec`.
int64_t adapter_bytes(const ModelSpec& spec, const LoraSpec& l) {
  int64_t n = 0;
  for (size_t k = 0; k + 1 < spec.dims.size(); k++)
    if (l.adapts(2 * static_cast<int>(k))) n += l.rank * (spec.dims[k] + spec.dims[k + 1]);
  return 4 * n;
}

TrainConfig lora_config(const std::string& strategy, int world, int64_t steps, int r) {
  TrainConfig c = test::demo_config(strategy, world, 16, steps);
  c.lora = lora(r);
  c.timeout_s = 20;
  return c;
}

}  // namespace

TEST_SUITE("lora") {

TEST_CASE("adapters are the parameters: peft's names and shapes, the base frozen beside them") {
  const ModelSpec spec = ModelSpec::parse("mlp:2,64,64,3");
  Model m(spec, nullptr, 0);
  m.enable_lora(lora(4), 0);
  const auto& p = m.parameters();
  REQUIRE(p.size() == 6);
  CHECK(p[0].name == "0.lora_A.weight");
  CHECK(p[0].shape == Shape{4, 2});
  CHECK(p[1].name == "0.lora_B.weight");
  CHECK(p[1].shape == Shape{64, 4});
  CHECK(p[5].name == "4.lora_B.weight");
  CHECK(p[5].shape == Shape{3, 4});
  CHECK(m.num_params() * 4 == adapter_bytes(spec, lora(4)));
  CHECK(m.base_parameters().size() == 6);
  CHECK(m.base_parameters()[2].name == "2.weight");
  // A: kaiming_uniform_(a=sqrt(5)) bound 1/sqrt(in); B: zeros.
  const std::vector<float> v = m.host_params();
  for (int64_t i = 0; i < p[2].numel; i++) CHECK(std::fabs(v[static_cast<size_t>(p[2].offset + i)]) <= 1.0f / 8.0f);
  for (int64_t i = 0; i < p[3].numel; i++) CHECK(v[static_cast<size_t>(p[3].offset + i)] == 0.0f);
  Model only(spec, nullptr, 0);
  only.enable_lora(lora(2, {2}), 0);
  REQUIRE(only.parameters().size() == 2);
  CHECK(only.parameters()[0].name == "2.lora_A.weight");
  CHECK(only.num_params() == 2 * (64 + 64));
}

TEST_CASE("B = 0 at init: the LoRA model's logits are the base model's, bit for bit") {
  const ModelSpec spec = ModelSpec::parse("mlp:2,64,64,3");
  Model base(spec, nullptr, 3), adapted(spec, nullptr, 3);
  adapted.enable_lora(lora(8), 3);
  const std::vector<float> x = test::random_floats(static_cast<size_t>(10 * 2), 1);
  const float* a = base.forward(x.data(), 10);
  const float* b = adapted.forward(x.data(), 10);
  for (int i = 0; i < 30; i++) CHECK(a[i] == b[i]);
}

TEST_CASE("adapter gradients equal scaling x dW A^T and scaling x B^T dW of the merged model") {
  // With nonzero B, the merged plain model computes the same function; its weight gradient dW gives
  // the adapters' by the chain rule (dB = s dW A^T, dA = s B^T dW), through every layer's input gradient.
  const ModelSpec spec = ModelSpec::parse("mlp:3,16,12,4");
  LoraSpec l = lora(3);
  l.alpha = 6.0f;  // scaling 2
  Model m(spec, nullptr, 7);
  m.enable_lora(l, 7);
  m.upload_params(test::random_floats(static_cast<size_t>(m.num_params()), 2).data());
  Model plain(spec, nullptr, 0);
  plain.upload_params(m.merged_params().data());
  const int64_t B = 5;
  const std::vector<float> x = test::random_floats(static_cast<size_t>(B * 3), 3), g = test::random_floats(static_cast<size_t>(B * 4), 4);
  const float* lm = m.forward(x.data(), B);
  const float* lp = plain.forward(x.data(), B);
  for (int i = 0; i < B * 4; i++) CHECK(lm[i] == doctest::Approx(lp[i]).epsilon(1e-5));
  m.zero_grad();
  plain.zero_grad();
  m.backward(g.data());
  plain.backward(g.data());
  const std::vector<float> ad = m.host_params();
  for (int li = 0; li < m.num_layers(); li++) {
    const Layer& L = m.layer(li);
    if (L.kind != LayerKind::Linear) continue;
    const int64_t in = L.in_features, out = L.out_features, r = 3;
    const float* dW = plain.parameters()[static_cast<size_t>(L.weight)].grad;
    const Parameter& A = m.parameters()[static_cast<size_t>(L.lora_a)];
    const Parameter& Bm = m.parameters()[static_cast<size_t>(L.lora_b)];
    for (int64_t o = 0; o < out; o++)
      for (int64_t k = 0; k < r; k++) {
        double want = 0;
        for (int64_t i = 0; i < in; i++) want += 2.0 * dW[o * in + i] * ad[static_cast<size_t>(A.offset + k * in + i)];
        CHECK(Bm.grad[o * r + k] == doctest::Approx(want).epsilon(1e-4).scale(1e-3));
      }
    for (int64_t k = 0; k < r; k++)
      for (int64_t i = 0; i < in; i++) {
        double want = 0;
        for (int64_t o = 0; o < out; o++) want += 2.0 * ad[static_cast<size_t>(Bm.offset + o * r + k)] * dW[o * in + i];
        CHECK(A.grad[k * in + i] == doctest::Approx(want).epsilon(1e-4).scale(1e-3));
      }
  }
}

TEST_CASE("a finite difference agrees with an adapter gradient") {
  const ModelSpec spec = ModelSpec::parse("mlp:2,8,3");
  Model m(spec, nullptr, 1);
  m.enable_lora(lora(2), 1);
  std::vector<float> p = test::random_floats(static_cast<size_t>(m.num_params()), 5);
  m.upload_params(p.data());
  const std::vector<float> x = test::random_floats(static_cast<size_t>(4 * 2), 6), g = test::random_floats(static_cast<size_t>(4 * 3), 7);
  auto loss = [&](const std::vector<float>& q) {
    m.upload_params(q.data());
    const float* y = m.forward(x.data(), 4);
    double s = 0;
    for (int i = 0; i < 12; i++) s += static_cast<double>(y[i]) * g[static_cast<size_t>(i)];
    return s;
  };
  loss(p);
  m.zero_grad();
  m.backward(g.data());
  const std::vector<float> grad(m.grads(), m.grads() + m.num_params());
  for (int64_t i = 0; i < m.num_params(); i += 3) {
    std::vector<float> hi = p, lo = p;
    hi[static_cast<size_t>(i)] += 1e-2f;
    lo[static_cast<size_t>(i)] -= 1e-2f;
    const double fd = (loss(hi) - loss(lo)) / (static_cast<double>(hi[static_cast<size_t>(i)]) - lo[static_cast<size_t>(i)]);
    CHECK(grad[static_cast<size_t>(i)] == doctest::Approx(fd).epsilon(2e-2).scale(1e-2));
  }
}

TEST_CASE("training: gradients and AdamW state cover only the adapters, the base stays as initialized") {
  TrainConfig c = lora_config("single", 1, 5, 4);
  Trainer t(c);
  TrainSummary s = t.run();
  const int64_t bytes = adapter_bytes(c.model, c.lora);
  const MemoryStats& m = s.rank_memory[0];
  CHECK(m.current_of(MemCategory::Gradients) == bytes);
  CHECK(m.current_of(MemCategory::OptimizerState) == 2 * bytes);  // 8 bytes per adapter parameter
  CHECK(m.current_of(MemCategory::Parameters) == c.model.num_params() * 4 + bytes);
  const std::vector<float> init = torch_init_values(c.model, c.seed, 0, 3);
  std::vector<float> now(init.size());
  const Parameter& last = t.model().base_parameters().back();
  t.model().device().download(now.data(), t.model().base_parameters()[0].data, (last.offset + last.numel) * 4);
  CHECK(now == init);
}

TEST_CASE("DDP buckets and FSDP reduce-scatters carry 4 x r x (in + out) bytes a step") {
  for (const std::string strategy : {"ddp", "fsdp"}) {
    CAPTURE(strategy);
    TrainConfig c = lora_config(strategy, 2, 3, 4);
    Trainer t(c);
    t.run();
    const int64_t bytes = adapter_bytes(c.model, c.lora);
    for (int rank = 0; rank < 2; rank++) {
      // DDP: the collectives its buckets launched (the step's 4-float loss sum is not one); FSDP: the
      // reduce-scatters (the full padded input, nccl-tests' size).
      std::vector<uint64_t> bucket_seqs;
      for (const Event& e : t.recorder().events(rank))
        if (e.kind == EventKind::BucketLaunch && e.iteration == 1) bucket_seqs.push_back(e.bucket.seq);
      int64_t moved = 0;
      for (const Event& e : t.recorder().events(rank)) {
        if (e.kind != EventKind::Collective || e.iteration != 1) continue;
        const bool bucket = std::find(bucket_seqs.begin(), bucket_seqs.end(), e.coll.seq) != bucket_seqs.end();
        if (c.strategy == Strategy::Ddp ? bucket : e.coll.op == CollectiveOp::ReduceScatter) moved += e.coll.bytes;
      }
      if (c.strategy == Strategy::Ddp) CHECK(!bucket_seqs.empty());
      CHECK(moved == bytes);
    }
  }
}

// --precision bf16 with LoRA (issue 34; model.h's set_precision): the frozen base in 16 bits, the
// adapters 16-bit for compute with fp32 master copies in the optimizer. B = 0 at init, so the 16-bit
// LoRA model's logits are the 16-bit base model's bit for bit (out + round(0 * scaling) = out).
TEST_CASE("bf16 LoRA: B = 0 leaves the bf16 base model's logits bit for bit") {
  const ModelSpec spec = ModelSpec::parse("mlp:2,64,64,3");
  const std::vector<float> x = test::random_floats(32 * 2, 5);
  Model base(spec, nullptr, 0), adapted(spec, nullptr, 0);
  adapted.enable_lora(lora(4), 0);
  base.set_precision(Precision::BF16);
  adapted.set_precision(Precision::BF16);
  const float* a = base.forward(x.data(), 32);
  const std::vector<float> want(a, a + 32 * 3);
  const float* b = adapted.forward(x.data(), 32);
  CHECK(std::vector<float>(b, b + 32 * 3) == want);
}

// Against fp32 LoRA after 3 steps of SGD (momentum 0.9, no decay: the update is proportional to the
// gradient, so the difference measures the 16-bit gradients; AdamW's normalized update would turn the
// sign of a near-zero gradient into a whole lr step). Each adapter matrix, normwise relative: A within
// 2^-7 (its one bf16 rounding at init is 2^-9; measured 0.0024), B within 2^-4 (B is 3 steps of 16-bit
// gradients, each through about ten bf16 roundings of 2^-9 on the way from the loss, and a sum over
// the batch of rounded products; measured 0.044 on one rank, 0.013 on two). The bytes: 2 per base
// parameter, 2 + 2 + 4 + 8 per adapter parameter.
TEST_CASE("bf16 LoRA: a 16-bit frozen base, fp32 master adapters, fp32 LoRA's adapters within bf16 rounding") {
  struct Run {
    const char* strategy;
    int world;
  };
  for (Run r : {Run{"single", 1}, Run{"ddp", 2}, Run{"fsdp", 2}}) {
    CAPTURE(r.strategy);
    TrainConfig ref = lora_config(r.strategy, r.world, 3, 4);
    ref.optimizer.kind = OptimizerKind::SGD;
    ref.optimizer.momentum = 0.9;
    ref.optimizer.weight_decay = 0;
    Trainer f(ref);
    f.run();
    TrainConfig c = ref;
    c.precision = Precision::BF16;
    Trainer h(c);
    const TrainSummary s = h.run();
    for (int rank = 0; rank < r.world; rank++) {
      CAPTURE(rank);
      REQUIRE(h.rank_model(rank).precision() == Precision::BF16);
      const std::vector<float> want = f.rank_model(rank).host_params(), got = h.rank_model(rank).host_params();
      REQUIRE(got.size() == want.size());
      for (const Parameter& p : f.rank_model(rank).parameters()) {
        CAPTURE(p.name);
        double d2 = 0, w2 = 0;
        for (int64_t i = p.offset; i < p.offset + p.numel; i++) {
          d2 += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
          w2 += static_cast<double>(want[i]) * want[i];
        }
        const bool is_a = p.name.find("lora_A") != std::string::npos;
        CHECK(std::sqrt(d2 / w2) <= (is_a ? 1.0 / 128 : 1.0 / 16));
      }
    }
    if (std::string(r.strategy) == "fsdp") continue;  // FSDP keeps sharded fp32 masters instead
    const int64_t bytes = adapter_bytes(c.model, c.lora);  // 4 bytes per adapter parameter
    const MemoryStats& m = s.rank_memory[0];
    CHECK(m.current_of(MemCategory::Parameters) == c.model.num_params() * 2 + bytes / 2);
    CHECK(m.current_of(MemCategory::Gradients) == bytes / 2);
    CHECK(m.current_of(MemCategory::MasterWeights) == bytes);
    CHECK(m.current_of(MemCategory::OptimizerState) == bytes);  // SGD's momentum, 4 bytes each
  }
}

TEST_CASE("DDP and FSDP with LoRA train every rank to the one-rank run's adapters") {
  // Rank 1 builds its replica from seed + 1: the frozen base must still be rank 0's (as torch's DDP
  // broadcasts frozen parameters too) and the adapters arrive by DDP's or FSDP's broadcast.
  TrainConfig one = lora_config("single", 1, 12, 4);
  one.batch = 32;
  one.lora.layers = {0, 4};
  Trainer ref(one);
  ref.run();
  for (const std::string strategy : {"ddp", "fsdp"}) {
    CAPTURE(strategy);
    TrainConfig c = lora_config(strategy, 2, 12, 4);
    c.lora.layers = {0, 4};
    Trainer t(c);
    t.run();
    for (int r = 0; r < 2; r++) CHECK(test::max_abs_diff(t.rank_model(r), ref.model()) <= 1e-5);
  }
}

TEST_CASE("LoRA on spiral: the loss falls though the base never trains") {
  TrainConfig c = lora_config("single", 1, 400, 4);
  c.batch = 64;
  c.lora.alpha = 16.0f;
  TrainConfig before = c;
  before.steps = 1;
  before.optimizer.lr = 1e-12;  // the loss of the initial model
  const float start = Trainer(before).run().eval_loss;
  const TrainSummary s = Trainer(c).run();
  MESSAGE("LoRA r=4 spiral: eval loss " << start << " -> " << s.eval_loss << ", accuracy " << s.eval_accuracy);
  CHECK(s.eval_loss < 0.2f * start);  // measured: 1.08 -> 0.012, accuracy 99.8%
  CHECK(s.eval_accuracy > 0.9);
}

TEST_CASE("--save writes peft's adapter keys, --merge-lora a plain model with the LoRA model's logits") {
  const std::string dir = "/tmp/dtlab_test_lora_" + std::to_string(::getpid());
  TrainConfig c = lora_config("single", 1, 20, 4);
  c.save_path = dir + "_adapters.safetensors";
  Trainer t(c);
  t.run();
  const SafetensorsFile f = load_safetensors(c.save_path);
  REQUIRE(f.entries.size() == 6);
  for (const char* key : {"base_model.model.0.lora_A.weight", "base_model.model.0.lora_B.weight",
                          "base_model.model.4.lora_B.weight"})
    CHECK(f.find(key) != nullptr);
  CHECK(f.metadata.at("lora_rank") == "4");
  CHECK(f.metadata.at("lora_alpha") == "8");
  c.save_path = dir + "_merged.safetensors";
  c.merge_lora = true;
  Trainer t2(c);
  t2.run();
  Model plain(c.model, nullptr, 99);
  load_checkpoint(c.save_path, plain);
  const std::vector<float> x = test::random_floats(static_cast<size_t>(32 * 2), 8);
  const float* want = t2.model().forward(x.data(), 32);
  const std::vector<float> w(want, want + 32 * 3);
  const float* got = plain.forward(x.data(), 32);
  for (int i = 0; i < 32 * 3; i++) CHECK(got[i] == doctest::Approx(w[static_cast<size_t>(i)]).epsilon(1e-5).scale(1e-5));
  std::remove((dir + "_adapters.safetensors").c_str());
  std::remove(c.save_path.c_str());
}

TEST_CASE("bad LoRA settings get one sentence") {
  TrainConfig c = lora_config("single", 1, 2, 0);
  c.lora.rank = -1;
  CHECK(test::error_of(c) == "--lora-rank -1 is not a rank; give a whole number of at least 1, e.g. --lora-rank 4");
  c.lora = lora(4, {1});
  CHECK(test::error_of(c) ==
        "--lora-layers names layer 1, which is not a Linear of mlp:2,64,64,3; its Linear layers are 0, 2, ..., 4");
  c.lora = lora(4);
  c.merge_lora = true;
  CHECK(test::error_of(c) == "--merge-lora says what --save writes; add --save PATH.safetensors");
  c.merge_lora = false;
  c.lora.rank = 0;
  c.merge_lora = true;
  CHECK(test::error_of(c) == "--merge-lora merges LoRA adapters; add --lora-rank R");
}

TEST_CASE("LoRA under sequence parallelism trains as under plain TP") {
  TrainConfig sp = lora_config("ddp", 2, 2, 4);
  sp.tp = 2;
  sp.sequence_parallel = true;
  TrainConfig tp = sp;
  tp.sequence_parallel = false;
  Trainer a(sp), b(tp);
  a.run();
  b.run();
  REQUIRE(a.result_model().num_params() == b.result_model().num_params());
  CHECK(test::max_abs_diff(a.result_model(), b.result_model()) <= 1e-5);
}

}  // TEST_SUITE
