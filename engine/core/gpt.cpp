#include "engine/core/gpt.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "engine/core/check.h"

namespace dtlab {

// ---- the model ----

namespace {
constexpr int64_t kF32 = sizeof(float);  // bytes per element of the device calls below
}  // namespace

GptCore::GptCore(const GptSpec& spec, MemoryTracker* tracker, Device& device, GptRange range, const TensorParallelSpec& tp)
    : s_(spec), r_(range.end == 0 ? GptRange::all(spec) : range), tp_(tp), tracker_(tracker), dev_(device) {
  DTLAB_CHECK(tp.degree >= 1 && tp.rank >= 0 && tp.rank < tp.degree && spec.heads % tp.degree == 0 &&
                  (!sp() || spec.ctx % tp.degree == 0),
              "a GPT tensor-parallel shard needs heads (and, sequence parallel, ctx) divisible by its degree");
  DTLAB_CHECK(r_.first >= 0 && r_.end <= spec.layers + 2 && r_.first_block() < r_.end_block(spec),
              "a GPT stage holds at least one block");
  const int L = static_cast<int>(spec.layers);
  if (r_.whole(spec)) {  // gpt_parameters()' indices
    block0_ = GptParamIndex::block(0, GptParamIndex::Ln1W);
    lnf_w_ = GptParamIndex::ln_f_weight(L);
    lnf_b_ = GptParamIndex::ln_f_bias(L);
    head_ = GptParamIndex::kWte;
    return;
  }
  const int blocks = r_.end_block(spec) - r_.first_block();
  block0_ = r_.embeds() ? 2 : 0;
  if (r_.heads(spec)) {
    lnf_w_ = block0_ + GptParamIndex::kPerBlock * blocks;
    lnf_b_ = lnf_w_ + 1;
    head_ = r_.embeds() ? GptParamIndex::kWte : lnf_b_ + 1;
  }
}

std::array<std::vector<Tensor>*, 13> GptCore::per_block() {
  return {&ln1_, &ln1_mean_, &ln1_rstd_, &qkv_, &att_, &atty_, &res2_, &ln2_, &ln2_mean_, &ln2_rstd_, &fch_, &fch_gelu_, &res3_};
}

void GptCore::release() {
  for (auto* v : per_block()) v->clear();
  for (Tensor* t : {&encoded_, &lnf_, &lnf_mean_, &lnf_rstd_, &logits_, &dres_, &dbuf_, &dqkv_, &dfch_, &datt_, &full_, &perm_,
                    &dfull_, &dloc_, &lnf_full_, &dlogits_local_, &part_, &wte_part_, &dlogits_kept_, &lora_t_, &lora_u_,
                    &lora_dx_, &lora_part_, &tokens_})
    *t = Tensor();
  douts_.clear();
  capacity_ = 0;
  B_ = 0;
  idx_ = nullptr;
  x_ = nullptr;
}

void GptCore::ensure(int64_t B) {
  B_ = B;
  if (B <= capacity_ && checkpointed_alloc_ == checkpointing_) return;
  const int64_t T = s_.ctx, C = s_.embd, BT = B * T, L = r_.end_block(s_) - r_.first_block();
  const int64_t R = residual_rows(B), Ct = C / tp_.degree, H = s_.heads / tp_.degree;  // this rank's rows, width, heads
  auto act = [&](Shape shape) { return Tensor(std::move(shape), MemCategory::Activations, tracker_, DType::F32, dev_); };
  for (auto* v : per_block()) v->clear();
  encoded_ = r_.embeds() ? act({R, C}) : Tensor();
  // (Not counted as activations: torch's input tensor is the caller's too.)
  tokens_ = r_.embeds() ? Tensor({BT}, MemCategory::Activations, nullptr, DType::I64, dev_) : Tensor();
  for (int64_t l = 0; l < L; l++) {
    res3_.push_back(act({R, C}));
    if (checkpointing_ && l > 0) continue;  // one set of the blocks' inner buffers, shared
    ln1_.push_back(act({R, C}));
    ln1_mean_.push_back(act({R}));
    ln1_rstd_.push_back(act({R}));
    qkv_.push_back(act({BT, 3 * Ct}));
    att_.push_back(act({B, H, T, T}));
    atty_.push_back(act({BT, Ct}));
    res2_.push_back(act({R, C}));
    ln2_.push_back(act({R, C}));
    ln2_mean_.push_back(act({R}));
    ln2_rstd_.push_back(act({R}));
    fch_.push_back(act({BT, 4 * Ct}));
    fch_gelu_.push_back(act({BT, 4 * Ct}));
  }
  if (r_.heads(s_)) {
    lnf_ = act({R, C});
    lnf_mean_ = act({R});
    lnf_rstd_ = act({R});
    logits_ = act({BT, s_.vocab});
  }
  dres_ = act({R, C});
  dbuf_ = act({BT, C});
  dqkv_ = act({BT, 3 * Ct});
  dfch_ = act({BT, 4 * Ct});
  datt_ = act({T, T});
  if (sp()) {
    full_ = act({BT, C});
    perm_ = act({BT, C});
    dfull_ = act({BT, C});
    dloc_ = act({R, C});
    auto scratch = [&](int64_t n) { return Tensor({n}, MemCategory::Gradients, tracker_, DType::F32, dev_); };
    part_ = scratch(std::max(r_.embeds() ? s_.ctx * C : 0, 2 * C));
    if (r_.heads(s_)) {
      lnf_full_ = act({BT, C});
      dlogits_local_ = act({R, s_.vocab});
    }
    if (r_.heads(s_) || r_.embeds()) wte_part_ = scratch(s_.vocab * C);
  }
  if (frozen()) {
    const int64_t r = lora_.rank;
    lora_t_ = act({2 * BT * r});
    lora_u_ = act({BT, 3 * Ct});
    lora_dx_ = act({BT, C});
    if (tp()) lora_part_ = Tensor({r * C}, MemCategory::Gradients, tracker_, DType::F32, dev_);
  }
  capacity_ = B;
  checkpointed_alloc_ = checkpointing_;
}

void GptCore::lora_forward(int l, float* out, const float* in) {
  const std::vector<Parameter>& ad = *lora_.params;
  const Parameter& A = ad[static_cast<size_t>(adapter(l))];
  const Parameter& Bm = ad[static_cast<size_t>(adapter(l) + 1)];
  const int64_t BT = B_ * s_.ctx, C = s_.embd, O = 3 * C / tp_.degree, r = lora_.rank;
  float* t = lora_t_.f32();
  float* u = lora_u_.f32();
  dev_.linear_forward(t, in, A.data, nullptr, BT, C, r);
  dev_.linear_forward(u, t, Bm.data, nullptr, BT, r, O);
  dev_.scale(u, BT * O, lora_.scaling);
  dev_.accumulate(out, u, BT * O, false);
}

void GptCore::lora_backward(int l, float* dinp, const float* dout, const float* in, bool weights, int layer) {
  const std::vector<Parameter>& ad = *lora_.params;
  const Parameter& A = ad[static_cast<size_t>(adapter(l))];
  const Parameter& Bm = ad[static_cast<size_t>(adapter(l) + 1)];
  const int64_t BT = B_ * s_.ctx, C = s_.embd, O = 3 * C / tp_.degree, r = lora_.rank;
  float* gA = weights ? A.grad : nullptr;
  if (gA && tp()) {  // every rank's dt covers its own heads' outputs: A's gradient is a partial sum
    gA = lora_part_.f32();
    dev_.fill_zero(gA, r * C * kF32);
  }
  float* t = lora_t_.f32();
  float* dt = t + BT * r;
  if (weights) dev_.linear_forward(t, in, A.data, nullptr, BT, C, r);
  float* ds = lora_u_.f32();
  dev_.scale_copy(ds, dout, BT * O, lora_.scaling);
  dev_.linear_backward(dt, weights ? Bm.grad : nullptr, nullptr, ds, weights ? t : nullptr, Bm.data, BT, r, O);
  float* dx = dinp ? lora_dx_.f32() : nullptr;
  dev_.linear_backward(dx, gA, nullptr, dt, weights ? in : nullptr, A.data, BT, C, r);
  if (dx) dev_.accumulate(dinp, dx, BT * C, false);
  if (gA && tp()) add_group_sum(gA, layer, {{A.grad, r * C}});
}

double GptCore::layer_flops(int layer, int64_t B) const {
  const double BT = static_cast<double>(B * s_.ctx), C = static_cast<double>(s_.embd), T = static_cast<double>(s_.ctx);
  if (layer == 0) return BT * C;  // the embedding sum
  if (layer == s_.layers + 1) return 2.0 * BT * C * static_cast<double>(s_.vocab) + 8.0 * BT * C;
  // c_attn, c_proj, c_fc, c_proj: 2 BT (3C^2 + C^2 + 4C^2 + 4C^2); attention: q.k and a.v over the
  // causal half, 2 x 2 x B x T x T/2 x C. A TP shard does 1/t of both.
  const double t = tp_.degree;
  return (2.0 * BT * 12.0 * C * C + 2.0 * BT * T * C) / t + 16.0 * BT * C;
}

const float* GptCore::attention(int l, int64_t b, int64_t h) const {
  const int64_t H = s_.heads / tp_.degree, mine = h - tp_.rank * H;  // this rank's heads are [rank H, rank H + H)
  if (B_ == 0 || checkpointing_ || l < r_.first_block() || l >= r_.end_block(s_) || b < 0 || b >= B_ || mine < 0 || mine >= H)
    return nullptr;
  return att_[local(l)].f32() + (b * H + mine) * s_.ctx * s_.ctx;
}

const float* GptCore::seq_gather(float* full, const float* local, int64_t w, int layer) {
  const int64_t t = tp_.degree, B = B_, T = s_.ctx, Tl = T / t;
  float* g = perm_.f32();  // rank r's rows of every sample, then rank r + 1's
  comm_->all_gather(g, local, B * Tl * w, layer);
  for (int64_t r = 0; r < t; r++)
    for (int64_t b = 0; b < B; b++) dev_.copy(full + (b * T + r * Tl) * w, g + (r * B + b) * Tl * w, Tl * w * kF32);
  return full;
}

void GptCore::seq_reduce_scatter(float* local, const float* full, int64_t w, int layer) {
  const int64_t t = tp_.degree, B = B_, T = s_.ctx, Tl = T / t;
  float* g = perm_.f32();
  for (int64_t r = 0; r < t; r++)
    for (int64_t b = 0; b < B; b++) dev_.copy(g + (r * B + b) * Tl * w, full + (b * T + r * Tl) * w, Tl * w * kF32);
  comm_->reduce_scatter(local, g, B * Tl * w, layer);
}

void GptCore::seq_rows(float* local, const float* full, int64_t w) const {
  const int64_t B = B_, T = s_.ctx, Tl = T / tp_.degree;
  for (int64_t b = 0; b < B; b++) dev_.copy(local + b * Tl * w, full + (b * T + tp_.rank * Tl) * w, Tl * w * kF32);
}

const float* GptCore::row_parallel(const float* in, const float* w, const float* b, int64_t width, int layer) {
  const int64_t BT = B_ * s_.ctx, C = s_.embd, R = residual_rows(B_);
  float* out = dbuf_.f32();
  if (!tp()) {
    dev_.linear_forward(out, in, w, b, BT, width, C);
    return out;
  }
  dev_.linear_forward(out, in, w, nullptr, BT, width, C);  // this rank's partial sums
  float* y = out;
  if (sp()) seq_reduce_scatter(y = dloc_.f32(), out, C, layer);
  else comm_->all_reduce(out, BT * C, layer);
  dev_.add_rows(y, b, R, C);  // RowParallelLinear adds the bias after the sum
  return y;
}

const float* GptCore::column_input_grad(float* d, int layer) {
  if (!tp()) return d;
  if (!sp()) {
    comm_->all_reduce(d, B_ * s_.ctx * s_.embd, layer);
    return d;
  }
  seq_reduce_scatter(dloc_.f32(), d, s_.embd, layer);
  return dloc_.f32();
}

void GptCore::ln_backward(std::vector<Parameter>& p, float* dinp, int wi, int bi, const float* dout, const float* inp,
                          const float* mean, const float* rstd, int layer) {
  const int64_t C = s_.embd, R = residual_rows(B_);
  Parameter& w = p[static_cast<size_t>(wi)];
  Parameter& b = p[static_cast<size_t>(bi)];
  if (!sp() || !w.grad) {  // (a frozen LoRA base: no parameter gradients)
    dev_.layernorm_backward(dinp, w.grad, b.grad, dout, inp, w.data, mean, rstd, R, C);
    return;
  }
  float* part = part_.f32();  // weight's then bias's, summed in one all-reduce
  dev_.fill_zero(part, 2 * C * kF32);
  dev_.layernorm_backward(dinp, part, part + C, dout, inp, w.data, mean, rstd, R, C);
  add_group_sum(part, layer, {{w.grad, C}, {b.grad, C}});
}

void GptCore::add_group_sum(float* part, int layer, std::initializer_list<std::pair<float*, int64_t>> into) {
  int64_t n = 0;
  for (const auto& [grad, len] : into) n += len;
  comm_->all_reduce(part, n, layer);
  for (const auto& [grad, len] : into) {
    dev_.accumulate(grad, part, len, false);
    part += len;
  }
}

void GptCore::block_forward(std::vector<Parameter>& p, int l, const float* x) {
  using P = GptParamIndex;
  const int64_t B = B_, T = s_.ctx, C = s_.embd, BT = B * T, R = residual_rows(B), Ct = C / tp_.degree;
  auto w = [&](int i) { return p[static_cast<size_t>(i)].data; };
  const size_t k = slot(l);
  const int layer = 1 + l;
  dev_.layernorm_forward(ln1_[k].f32(), ln1_mean_[k].f32(), ln1_rstd_[k].f32(), x, w(pi(l, P::Ln1W)), w(pi(l, P::Ln1B)), R, C);
  const float* a = sp() ? seq_gather(full_.f32(), ln1_[k].f32(), C, layer) : ln1_[k].f32();  // f
  dev_.linear_forward(qkv_[k].f32(), a, w(pi(l, P::AttnW)), w(pi(l, P::AttnB)), BT, C, 3 * Ct);
  if (adapter(l) >= 0) lora_forward(l, qkv_[k].f32(), a);
  dev_.attention_forward(atty_[k].f32(), att_[k].f32(), qkv_[k].f32(), B, T, Ct, s_.heads / tp_.degree);
  const float* proj = row_parallel(atty_[k].f32(), w(pi(l, P::AttnProjW)), w(pi(l, P::AttnProjB)), Ct, layer);  // g
  float* r2 = res2_[k].f32();
  dev_.add(r2, x, proj, R * C);
  dev_.layernorm_forward(ln2_[k].f32(), ln2_mean_[k].f32(), ln2_rstd_[k].f32(), r2, w(pi(l, P::Ln2W)), w(pi(l, P::Ln2B)), R, C);
  a = sp() ? seq_gather(full_.f32(), ln2_[k].f32(), C, layer) : ln2_[k].f32();
  dev_.linear_forward(fch_[k].f32(), a, w(pi(l, P::FcW)), w(pi(l, P::FcB)), BT, C, 4 * Ct);
  dev_.gelu_forward(fch_gelu_[k].f32(), fch_[k].f32(), BT * 4 * Ct);
  proj = row_parallel(fch_gelu_[k].f32(), w(pi(l, P::FcProjW)), w(pi(l, P::FcProjB)), 4 * Ct, layer);
  dev_.add(res3_[local(l)].f32(), r2, proj, R * C);
}

const float* GptCore::forward(std::vector<Parameter>& p, const int64_t* idx, int64_t B, ComputeObserver* obs, LayerGate* gate,
                              LayerHooks* hooks, const float* x_in) {
  using P = GptParamIndex;
  DTLAB_CHECK(r_.embeds() ? idx != nullptr : x_in != nullptr, "a GPT stage's forward needs its input: tokens where it embeds, else x");
  DTLAB_CHECK(!tp() || comm_ != nullptr, "a GPT tensor-parallel shard runs only after set_tp_comm()");
  ensure(B);
  if (r_.embeds()) {  // a copy: backward, attention() and tokens() never read a caller's buffer that is gone
    dev_.copy(tokens_.raw(), idx, B * s_.ctx * static_cast<int64_t>(sizeof(int64_t)));
    idx = tokens_.i64();
  }
  idx_ = idx;
  x_ = x_in;
  const int64_t T = s_.ctx, C = s_.embd, BT = B * T, V = s_.vocab, R = residual_rows(B);
  // This rank's positions: all, or under sequence parallelism [rank T/t, rank T/t + T/t) of each sample.
  const int64_t Tl = R / B, t0 = sp() ? tp_.rank * Tl : 0;
  const int L = static_cast<int>(s_.layers);
  auto w = [&](int i) { return p[static_cast<size_t>(i)].data; };  // read after the layer's hooks (FSDP binds)
  auto enter = [&](int layer) {
    if (gate) gate->before_layer(layer, false);
    if (hooks) hooks->before_forward(layer);
  };
  if (r_.embeds()) {
    enter(0);
    {
      ComputeScope scope(obs, ComputeKind::LayerForward, 0, layer_flops(0, B));
      dev_.embedding_forward(encoded_.f32(), w(P::kWte), w(P::kWpe), idx, R, Tl, T, t0, C);
    }
    if (hooks) hooks->after_forward(0);
  }
  const float* x = r_.embeds() ? encoded_.f32() : x_in;
  for (int l = r_.first_block(); l < r_.end_block(s_); l++) {
    enter(1 + l);
    std::optional<ComputeScope> scope(std::in_place, obs, ComputeKind::LayerForward, 1 + l, layer_flops(1 + l, B));
    block_forward(p, l, x);
    x = res3_[local(l)].f32();
    scope.reset();  // the hooks' collectives (FSDP's reshard) follow the layer, outside its span
    if (hooks) hooks->after_forward(1 + l);
  }
  if (!r_.heads(s_)) return x;
  enter(L + 1);
  {
    ComputeScope scope(obs, ComputeKind::LayerForward, L + 1, layer_flops(L + 1, B));
    dev_.layernorm_forward(lnf_.f32(), lnf_mean_.f32(), lnf_rstd_.f32(), x, w(lnf_w_), w(lnf_b_), R, C);
    // Under sequence parallelism every rank's positions are gathered first: the logits are whole.
    const float* a = sp() ? seq_gather(lnf_full_.f32(), lnf_.f32(), C, L + 1) : lnf_.f32();
    dev_.linear_forward(logits_.f32(), a, w(head_), nullptr, BT, C, V);  // lm_head, tied
  }
  if (hooks) hooks->after_forward(L + 1);
  return logits_.f32();
}

const float* GptCore::backward(std::vector<Parameter>& p, const float* dlogits, const Model::GradReadyHook& ready,
                              ComputeObserver* obs, LayerGate* gate, LayerHooks* hooks) {
  return run_backward(p, dlogits, ready, obs, gate, hooks, false);
}

const float* GptCore::backward_input(std::vector<Parameter>& p, const float* dlogits, const Model::GradReadyHook& ready,
                                     ComputeObserver* obs, LayerGate* gate, LayerHooks* hooks) {
  return run_backward(p, dlogits, ready, obs, gate, hooks, true);
}

const float* GptCore::run_backward(std::vector<Parameter>& p, const float* dlogits, const Model::GradReadyHook& ready,
                                   ComputeObserver* obs, LayerGate* gate, LayerHooks* hooks, bool input_only) {
  using P = GptParamIndex;
  DTLAB_CHECK(idx_ != nullptr || x_ != nullptr, "backward() called before forward()");
  const int64_t B = B_, T = s_.ctx, C = s_.embd, BT = B * T, V = s_.vocab, R = residual_rows(B), Ct = C / tp_.degree;
  const int64_t Tl = R / B, t0 = sp() ? tp_.rank * Tl : 0;
  const int L = static_cast<int>(s_.layers);
  auto w = [&](int i) { return p[static_cast<size_t>(i)].data; };
  auto g = [&](int i) { return p[static_cast<size_t>(i)].grad; };
  // A Linear's weight and bias gradients: left to backward_weight() (W) when this is ZB's I.
  auto lg = [&](int i) { return input_only ? nullptr : p[static_cast<size_t>(i)].grad; };
  auto done = [&](std::initializer_list<int> ids) {  // a frozen LoRA base has no gradients to report
    if (ready && !frozen())
      for (int i : ids) ready(i);
  };
  auto linear_done = [&](std::initializer_list<int> ids) {
    if (!input_only) done(ids);
  };
  auto enter = [&](int layer) {
    if (gate) gate->before_layer(layer, true);
    if (hooks) hooks->before_backward(layer);
  };
  // I keeps each Linear's output gradient for W (the buffers it reads are reused).
  auto keep = [&](Tensor& slot, const float* d, int64_t n) {
    if (!input_only) return;
    slot = Tensor({n}, MemCategory::Activations, tracker_, DType::F32, dev_);
    dev_.copy(slot.f32(), d, n * kF32);
  };
  if (input_only) {
    douts_.clear();
    douts_.resize(static_cast<size_t>(r_.end_block(s_) - r_.first_block()));
  }
  float* dres = dres_.f32();
  float* dbuf = dbuf_.f32();
  const int fb = r_.first_block();
  const float* input = r_.embeds() ? encoded_.f32() : x_;  // the first block's input
  if (r_.heads(s_)) {
    const float* last = res3_.back().f32();
    enter(L + 1);
    {
      ComputeScope scope(obs, ComputeKind::LayerBackward, L + 1, 2 * layer_flops(L + 1, B));
      if (!sp()) {
        dev_.linear_backward(dbuf, lg(head_), nullptr, dlogits, lnf_.f32(), w(head_), BT, C, V);
        if (!frozen()) keep(dlogits_kept_, dlogits, BT * V);  // (a frozen head has no W)
      } else {  // this rank's positions only: the gather's backward is a split, the weight's gradient partial
        float* dl = dlogits_local_.f32();
        seq_rows(dl, dlogits, V);
        float* part = frozen() ? nullptr : wte_part_.f32();
        if (part) dev_.fill_zero(part, V * C * kF32);
        dev_.linear_backward(dbuf, part, nullptr, dl, lnf_.f32(), w(head_), R, C, V);
        if (part && !r_.embeds()) {  // a last stage's own copy: complete now
          add_group_sum(part, L + 1, {{g(head_), V * C}});
        }
      }
      dev_.fill_zero(dres, R * C * kF32);
      ln_backward(p, dres, lnf_w_, lnf_b_, dbuf, last, lnf_mean_.f32(), lnf_rstd_.f32(), L + 1);
      // A last stage's own copy of the tied weight is complete here (the embedding group sums it with
      // the first stage's); the whole model's waits for the embedding's use below.
      if (r_.embeds() || (input_only && !sp())) done({lnf_b_, lnf_w_});
      else done({lnf_b_, lnf_w_, head_});
    }
    if (hooks) hooks->after_backward(L + 1);
  } else {
    dev_.copy(dres, dlogits, R * C * kF32);  // the next stage's gradient of this stage's output
  }
  for (int l = r_.end_block(s_) - 1; l >= fb; l--) {
    const size_t u = local(l), k = slot(l);
    const float* block_in = l > fb ? res3_[u - 1].f32() : input;
    if (checkpointing_) {  // the block's forward again, from its kept input, before its backward needs it
      if (hooks) hooks->before_recompute(1 + l);
      {
        ComputeScope scope(obs, ComputeKind::Recompute, 1 + l, layer_flops(1 + l, B));
        block_forward(p, l, block_in);
      }
      if (hooks) hooks->after_recompute(1 + l);
    }
    enter(1 + l);
    std::optional<ComputeScope> scope(std::in_place, obs, ComputeKind::LayerBackward, 1 + l, 2 * layer_flops(1 + l, B));
    const int layer = 1 + l;
    // A row-parallel Linear's bias under sequence parallelism saw this rank's positions: its gradient
    // is summed over the group (without, the whole output gradient gives every rank the whole sum).
    auto row_bias_grad = [&](int bi) {
      if (!g(bi)) return;  // frozen
      float* part = part_.f32();
      dev_.fill_zero(part, C * kF32);
      dev_.sum_rows(part, dres, R, C);
      add_group_sum(part, layer, {{g(bi), C}});
    };
    float* dfch = dfch_.f32();
    std::array<Tensor, 4>* kept = input_only ? &douts_[u] : nullptr;  // mlp.c_proj, c_fc, attn.c_proj, c_attn
    const float* dy = sp() ? seq_gather(dfull_.f32(), dres, C, layer) : dres;  // g's backward
    dev_.linear_backward(dfch, lg(pi(l, P::FcProjW)), sp() ? nullptr : lg(pi(l, P::FcProjB)), dy, fch_gelu_[k].f32(),
                         w(pi(l, P::FcProjW)), BT, 4 * Ct, C);
    if (kept && !frozen()) keep((*kept)[0], dy, BT * C);  // (under LoRA W needs c_attn's alone)
    if (sp()) row_bias_grad(pi(l, P::FcProjB));
    linear_done({pi(l, P::FcProjB), pi(l, P::FcProjW)});
    dev_.gelu_backward(dfch, dfch, fch_[k].f32(), BT * 4 * Ct);
    if (kept && !frozen()) keep((*kept)[1], dfch, BT * 4 * Ct);
    const float* a = sp() ? seq_gather(full_.f32(), ln2_[k].f32(), C, layer) : ln2_[k].f32();  // gathered again
    dev_.linear_backward(dbuf, lg(pi(l, P::FcW)), lg(pi(l, P::FcB)), dfch, a, w(pi(l, P::FcW)), BT, C, 4 * Ct);
    const float* dln = column_input_grad(dbuf, layer);  // f's backward
    linear_done({pi(l, P::FcB), pi(l, P::FcW)});
    ln_backward(p, dres, pi(l, P::Ln2W), pi(l, P::Ln2B), dln, res2_[k].f32(), ln2_mean_[k].f32(), ln2_rstd_[k].f32(), layer);
    done({pi(l, P::Ln2B), pi(l, P::Ln2W)});
    dy = sp() ? seq_gather(dfull_.f32(), dres, C, layer) : dres;
    dev_.linear_backward(dbuf, lg(pi(l, P::AttnProjW)), sp() ? nullptr : lg(pi(l, P::AttnProjB)), dy, atty_[k].f32(),
                         w(pi(l, P::AttnProjW)), BT, Ct, C);
    if (kept && !frozen()) keep((*kept)[2], dy, BT * C);
    if (sp()) row_bias_grad(pi(l, P::AttnProjB));
    linear_done({pi(l, P::AttnProjB), pi(l, P::AttnProjW)});
    dev_.attention_backward(dqkv_.f32(), datt_.f32(), dbuf, qkv_[k].f32(), att_[k].f32(), B, T, Ct, s_.heads / tp_.degree);
    if (kept && (!frozen() || adapter(l) >= 0)) keep((*kept)[3], dqkv_.f32(), BT * 3 * Ct);
    a = sp() ? seq_gather(full_.f32(), ln1_[k].f32(), C, layer) : ln1_[k].f32();
    dev_.linear_backward(dbuf, lg(pi(l, P::AttnW)), lg(pi(l, P::AttnB)), dqkv_.f32(), a, w(pi(l, P::AttnW)), BT, C, 3 * Ct);
    if (adapter(l) >= 0) {  // peft's lora_B then lora_A; their input gradient joins c_attn's before f sums it
      lora_backward(l, dbuf, dqkv_.f32(), a, !input_only, layer);
      if (ready && !input_only) {
        ready(adapter(l) + 1);
        ready(adapter(l));
      }
    }
    dln = column_input_grad(dbuf, layer);
    linear_done({pi(l, P::AttnB), pi(l, P::AttnW)});
    ln_backward(p, dres, pi(l, P::Ln1W), pi(l, P::Ln1B), dln, block_in, ln1_mean_[k].f32(), ln1_rstd_[k].f32(), layer);
    done({pi(l, P::Ln1B), pi(l, P::Ln1W)});
    scope.reset();
    if (hooks) hooks->after_backward(1 + l);
  }
  if (!r_.embeds()) return dres;  // the gradient of the stage's input, for the previous stage
  enter(0);
  if (!frozen()) {  // (a frozen LoRA base: nothing to compute for the embeddings)
    ComputeScope scope(obs, ComputeKind::LayerBackward, 0, 2 * layer_flops(0, B));
    // Under sequence parallelism this rank's positions give partial sums (wte's already holds the
    // head's), summed over the group before they are added.
    float* dwte = sp() ? wte_part_.f32() : g(P::kWte);
    float* dwpe = sp() ? part_.f32() : g(P::kWpe);
    if (sp()) dev_.fill_zero(dwpe, T * C * kF32);
    if (sp() && !r_.heads(s_)) dev_.fill_zero(dwte, V * C * kF32);  // a first stage: no head's share
    dev_.embedding_backward(dwte, dwpe, dres, idx_, R, Tl, T, t0, C);
    if (sp()) {
      add_group_sum(dwpe, 0, {{g(P::kWpe), T * C}});
      add_group_sum(dwte, 0, {{g(P::kWte), V * C}});
    }
    if (input_only && r_.heads(s_) && !sp()) done({P::kWpe});  // wte waits for the head's share, in W
    else done({P::kWpe, P::kWte});
  }
  if (hooks) hooks->after_backward(0);
  return nullptr;
}

void GptCore::backward_weight(std::vector<Parameter>& p, const Model::GradReadyHook& ready, ComputeObserver* obs, LayerGate* gate,
                              LayerHooks* hooks) {
  using P = GptParamIndex;
  const int64_t B = B_, T = s_.ctx, C = s_.embd, BT = B * T, V = s_.vocab, Ct = C / tp_.degree;
  const int L = static_cast<int>(s_.layers);
  DTLAB_CHECK(douts_.size() == static_cast<size_t>(r_.end_block(s_) - r_.first_block()), "W ran before its I; the schedule is wrong");
  auto w = [&](int i) { return p[static_cast<size_t>(i)].data; };
  auto g = [&](int i) { return p[static_cast<size_t>(i)].grad; };
  auto done = [&](std::initializer_list<int> ids) {  // a frozen LoRA base has no gradients to report
    if (ready && !frozen())
      for (int i : ids) ready(i);
  };
  auto enter = [&](int layer) {
    if (gate) gate->before_layer(layer, true);
    if (hooks) hooks->before_backward(layer);
  };
  // The head first, then the blocks from the last, in B's order: each Linear's gradients from the
  // output gradient I kept and the input its forward saved.
  // (Under sequence parallelism I computed the head's weight gradient already: its share of the
  // positions is summed over the TP group with the embedding's.)
  // Under LoRA only the adapted blocks' c_attn has weights to compute.
  const bool base = !frozen();
  if (r_.heads(s_) && !sp() && base) {
    enter(L + 1);
    {
      ComputeScope scope(obs, ComputeKind::LayerBackward, L + 1, layer_flops(L + 1, B));
      dev_.linear_backward(nullptr, g(head_), nullptr, dlogits_kept_.f32(), lnf_.f32(), w(head_), BT, C, V);
      if (!r_.embeds()) done({head_});
    }
    if (hooks) hooks->after_backward(L + 1);
  }
  const int fb = r_.first_block();
  const float* input = r_.embeds() ? encoded_.f32() : x_;
  for (int l = r_.end_block(s_) - 1; l >= fb; l--) {
    const size_t u = local(l), k = slot(l);
    const bool work = base || adapter(l) >= 0;
    if (checkpointing_ && work) {  // the block's inputs again: its forward once more, from its kept input
      if (hooks) hooks->before_recompute(1 + l);
      ComputeScope scope(obs, ComputeKind::Recompute, 1 + l, layer_flops(1 + l, B));
      block_forward(p, l, l > fb ? res3_[u - 1].f32() : input);
    }
    if (checkpointing_ && work && hooks) hooks->after_recompute(1 + l);
    enter(1 + l);
    ComputeScope scope(obs, ComputeKind::LayerBackward, 1 + l, layer_flops(1 + l, B));
    std::array<Tensor, 4>& d = douts_[u];
    const int layer = 1 + l;
    // Under sequence parallelism the row layers' biases were summed in I, and the column layers read
    // their LayerNorm's output gathered once more.
    if (base) {
      dev_.linear_backward(nullptr, g(pi(l, P::FcProjW)), sp() ? nullptr : g(pi(l, P::FcProjB)), d[0].f32(), fch_gelu_[k].f32(),
                           w(pi(l, P::FcProjW)), BT, 4 * Ct, C);
      done({pi(l, P::FcProjB), pi(l, P::FcProjW)});
      const float* a = sp() ? seq_gather(full_.f32(), ln2_[k].f32(), C, layer) : ln2_[k].f32();
      dev_.linear_backward(nullptr, g(pi(l, P::FcW)), g(pi(l, P::FcB)), d[1].f32(), a, w(pi(l, P::FcW)), BT, C, 4 * Ct);
      done({pi(l, P::FcB), pi(l, P::FcW)});
      dev_.linear_backward(nullptr, g(pi(l, P::AttnProjW)), sp() ? nullptr : g(pi(l, P::AttnProjB)), d[2].f32(), atty_[k].f32(),
                           w(pi(l, P::AttnProjW)), BT, Ct, C);
      done({pi(l, P::AttnProjB), pi(l, P::AttnProjW)});
    }
    const float* a = work ? (sp() ? seq_gather(full_.f32(), ln1_[k].f32(), C, layer) : ln1_[k].f32()) : nullptr;
    if (base) {
      dev_.linear_backward(nullptr, g(pi(l, P::AttnW)), g(pi(l, P::AttnB)), d[3].f32(), a, w(pi(l, P::AttnW)), BT, C, 3 * Ct);
      done({pi(l, P::AttnB), pi(l, P::AttnW)});
    }
    if (adapter(l) >= 0) {
      lora_backward(l, nullptr, d[3].f32(), a, true, layer);
      if (ready) {
        ready(adapter(l) + 1);
        ready(adapter(l));
      }
    }
    for (Tensor& t : d) t = Tensor();
    if (hooks) hooks->after_backward(1 + l);
  }
  if (r_.embeds() && r_.heads(s_) && !sp()) done({P::kWte});  // the tied weight: the embedding's share came in I
  douts_.clear();
  dlogits_kept_ = Tensor();
}

std::vector<int32_t> gpt_generate(Model& model, const std::vector<int32_t>& prompt, int64_t n, float temperature, int64_t top_k,
                                  uint64_t seed) {
  DTLAB_CHECK(model.is_gpt(), "gpt_generate() on a model that is not a GPT");
  const int64_t T = model.spec().gpt.ctx, V = model.spec().gpt.vocab;
  if (prompt.empty()) throw Error("the prompt is empty; give at least one character to continue from");
  if (!(temperature > 0)) throw Error("the temperature must be greater than 0 (nanoGPT's sample.py uses 0.8)");
  for (int32_t t : prompt)
    if (t < 0 || t >= V) throw Error("the prompt holds token " + std::to_string(t) + ", outside the model's vocabulary of " + std::to_string(V));
  std::vector<int32_t> seq = prompt;
  std::vector<int64_t> idx(static_cast<size_t>(T));
  std::vector<double> p(static_cast<size_t>(V));
  std::mt19937_64 gen(seed);
  // A device model reads its tokens from device memory and hands the logits back.
  Device& dev = model.device();
  dev.bind_thread();
  Tensor idx_dev, logits_host;
  if (!dev.is_host()) {
    idx_dev = Tensor({T}, MemCategory::Activations, nullptr, DType::I64, dev);
    logits_host = Tensor({T, V}, MemCategory::Activations, nullptr);
  }
  for (int64_t k = 0; k < n; k++) {
    const int64_t len = std::min<int64_t>(T, static_cast<int64_t>(seq.size()));
    std::fill(idx.begin(), idx.end(), 0);
    std::copy(seq.end() - len, seq.end(), idx.begin());
    const float* logits = nullptr;
    if (dev.is_host()) {
      logits = model.forward_tokens(idx.data(), 1);
    } else {
      dev.upload(idx_dev.raw(), idx.data(), T * static_cast<int64_t>(sizeof(int64_t)));
      dev.download(logits_host.raw(), model.forward_tokens(idx_dev.i64(), 1), T * V * kF32);
      logits = logits_host.f32();
    }
    const float* row = logits + (len - 1) * V;
    // logits / temperature; top-k keeps the values >= the k-th largest (torch.topk's v[:, [-1]]).
    std::vector<float> z(row, row + V);
    for (float& x : z) x /= temperature;
    if (top_k > 0 && top_k < V) {
      std::vector<float> sorted = z;
      std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<float>());
      const float kth = sorted[static_cast<size_t>(top_k - 1)];
      for (float& x : z)
        if (x < kth) x = -INFINITY;
    }
    const float mx = *std::max_element(z.begin(), z.end());
    double sum = 0;
    for (int64_t v = 0; v < V; v++) sum += p[static_cast<size_t>(v)] = std::exp(static_cast<double>(z[static_cast<size_t>(v)] - mx));
    double u = std::uniform_real_distribution<double>(0.0, sum)(gen);
    int32_t pick = static_cast<int32_t>(V - 1);
    for (int64_t v = 0; v < V; v++) {
      u -= p[static_cast<size_t>(v)];
      if (u < 0) {
        pick = static_cast<int32_t>(v);
        break;
      }
    }
    seq.push_back(pick);
  }
  return std::vector<int32_t>(seq.begin() + static_cast<std::ptrdiff_t>(prompt.size()), seq.end());
}

}  // namespace dtlab
