#include "engine/core/gpt.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "engine/core/check.h"

namespace dtlab {

// ---- the model ----

namespace {
constexpr int64_t kF32 = sizeof(float);  // bytes per element of the float32 buffers below
}  // namespace

GptCore::GptCore(const GptSpec& spec, MemoryTracker* tracker, Device& device, GptRange range, const TensorParallelSpec& tp)
    : s_(spec), r_(range.end == 0 ? GptRange::all(spec) : range), tp_(tp), tracker_(tracker), dev_(device) {
  DTLAB_CHECK(tp.degree >= 1 && tp.rank >= 0 && tp.rank < tp.degree && spec.heads % tp.degree == 0 &&
                  (!sp() || spec.ctx % tp.degree == 0),
              "a GPT tensor-parallel shard needs heads (and, sequence parallel, ctx) divisible by its degree");
  DTLAB_CHECK(r_.first >= 0 && r_.end <= spec.layers + 2 && r_.first_block() < r_.end_block(spec),
              "a GPT stage holds at least one block");
  // (Megatron-core's MoELayer refuses to train tensor-parallel without sequence parallelism: each TP rank
  // then routes its own positions to whole experts.)
  DTLAB_CHECK(!spec.moe.on() || tp.degree == 1 || sp(), "a tensor-parallel GPT with MoE blocks needs sequence parallelism");
  if (spec.cp.on()) {
    const int64_t c = spec.cp.degree, chunks = spec.cp.layout == CpLayout::Zigzag ? 2 * c : c;
    DTLAB_CHECK(spec.cp.rank >= 0 && spec.cp.rank < c && spec.ctx % chunks == 0 && (!sp() || (spec.ctx / c) % tp.degree == 0),
                "a context-parallel GPT needs ctx divisible by its chunks (and its T/c by tp under sequence parallelism)");
    DTLAB_CHECK(spec.cp.layout != CpLayout::Ulysses || (spec.heads / tp.degree) % c == 0, "Ulysses needs the heads divisible by cp");
    for (int64_t r = 0; r < c; r++) cp_pos_.push_back(spec.cp.positions_of(r, spec.ctx));
  }
  using P = GptParamIndex;
  block0_ = r_.embeds() ? 2 : 0;  // (the whole model's parameters keep wte and wpe first, too)
  for (int l = r_.first_block(); l < r_.end_block(spec); l++) boff_.push_back(block0_ + P::blocks_between(spec, r_.first_block(), l));
  const int after = block0_ + P::blocks_between(spec, r_.first_block(), r_.end_block(spec));
  if (r_.heads(spec)) {
    lnf_w_ = after;
    lnf_b_ = after + 1;
    head_ = r_.embeds() ? P::kWte : lnf_b_ + 1;
  }
}

void GptCore::set_precision(Precision p) {
  const DType want = p == Precision::BF16 ? DType::BF16 : p == Precision::FP16 ? DType::F16 : DType::F32;
  if (want == adt_) return;
  release();
  adt_ = want;
  hf_ = half_format_of(p);
}

void GptCore::set_amp(Precision p) {
  DTLAB_CHECK(!is_mixed(p) || !half(), "set_amp() on a GPT with 16-bit parameters: autocast keeps them float32");
  if (is_mixed(p) == amp_ && (!amp_ || amp_hf_ == half_format_of(p))) return;
  release();
  amp_ = is_mixed(p);
  amp_hf_ = half_format_of(p);
  amp_dt_ = p == Precision::FP16 ? DType::F16 : DType::BF16;
}

// ---- float32 operands of 16-bit memory (set_precision) ----

int GptCore::claim(int64_t n) {
  int slot = -1;
  for (size_t k = 0; k < pool_.size(); k++)  // the smallest free slot that fits
    if (!busy_[k] && pool_[k].numel() >= n && (slot < 0 || pool_[k].numel() < pool_[static_cast<size_t>(slot)].numel()))
      slot = static_cast<int>(k);
  if (slot < 0) {  // a free slot grown to n, or a new one
    for (size_t k = 0; k < pool_.size() && slot < 0; k++)
      if (!busy_[k]) slot = static_cast<int>(k);
    if (slot < 0) {
      pool_.emplace_back();
      busy_.push_back(0);
      slot = static_cast<int>(pool_.size()) - 1;
    }
    Tensor& t = pool_[static_cast<size_t>(slot)];
    t = Tensor();
    t = Tensor({n}, MemCategory::Other, tracker_, DType::F32, dev_);
  }
  busy_[static_cast<size_t>(slot)] = 1;
  return slot;
}

GptCore::Host::Host(Device& dev, const float* p, int64_t n, bool in, bool out)
    : dev_(dev), p_(const_cast<float*>(p)), n_(n), out_(out && !dev.is_host()), h_(p_) {
  if (dev.is_host()) return;
  buf_.resize(static_cast<size_t>(n));
  h_ = buf_.data();
  if (in && n > 0) dev.download(h_, p, n * static_cast<int64_t>(sizeof(float)));
}

GptCore::Host::~Host() {
  if (out_ && n_ > 0) dev_.upload(p_, h_, n_ * static_cast<int64_t>(sizeof(float)));
}

GptCore::F32 GptCore::rd(const void* p, int64_t n) {
  if (!half() || !p) return F32(nullptr, -1, static_cast<float*>(const_cast<void*>(p)), nullptr, 0);
  const int slot = claim(n);
  float* f = pool_[static_cast<size_t>(slot)].f32();
  dev_.widen_half(f, static_cast<const uint16_t*>(p), n, hf_);
  return F32(this, slot, f, nullptr, n);
}

GptCore::F32 GptCore::wr(void* p, int64_t n) {
  if (!half() || !p) return F32(nullptr, -1, static_cast<float*>(p), nullptr, 0);
  const int slot = claim(n);
  return F32(this, slot, pool_[static_cast<size_t>(slot)].f32(), p, n);
}

GptCore::F32 GptCore::acc(void* p, int64_t n) {
  if (!half() || !p) return F32(nullptr, -1, static_cast<float*>(p), nullptr, 0);
  const int slot = claim(n);
  float* f = pool_[static_cast<size_t>(slot)].f32();
  dev_.widen_half(f, static_cast<const uint16_t*>(p), n, hf_);
  return F32(this, slot, f, p, n);
}

void GptCore::finish(int slot, float* f, void* back, int64_t n, F32::Fin fin) {
  if (fin == F32::Fin::Narrow) {
    if (back) dev_.narrow_half(static_cast<uint16_t*>(back), f, n, hf_);  // rounded once
  } else {
    dev_.round_half(f, n, amp_hf_);  // the 16-bit op's result, rounded once
    if (fin == F32::Fin::RoundAdd) dev_.accumulate(static_cast<float*>(back), f, n, false);  // the cast's backward, into float32
  }
  if (slot >= 0) busy_[static_cast<size_t>(slot)] = 0;
}

GptCore::F32 GptCore::out16(void* p, int64_t n) {
  if (!amp_ || !p) return wr(p, n);
  return F32(this, -1, static_cast<float*>(p), nullptr, n, F32::Fin::Round);
}

GptCore::F32 GptCore::upd16(void* p, int64_t n) {
  if (!amp_ || !p) return acc(p, n);
  return F32(this, -1, static_cast<float*>(p), nullptr, n, F32::Fin::Round);
}

GptCore::F32 GptCore::cast16(const void* p, int64_t n) {
  if (!amp_ || !p) return rd(p, n);
  const int slot = claim(n);
  float* f = pool_[static_cast<size_t>(slot)].f32();
  dev_.copy(f, p, n * kF32);
  dev_.round_half(f, n, amp_hf_);  // x.to(dtype)
  return F32(this, slot, f, nullptr, n);
}

GptCore::F32 GptCore::cg(const Parameter* q) {
  if (!amp_ || !q || !q->grad) return pg(q);
  return cacc(q->grad, q->numel);
}

GptCore::F32 GptCore::cacc(void* p, int64_t n) {
  if (!amp_ || !p) return acc(p, n);
  const int slot = claim(n);
  float* f = pool_[static_cast<size_t>(slot)].f32();
  dev_.fill_zero(f, n * kF32);
  return F32(this, slot, f, p, n, F32::Fin::RoundAdd);
}

void GptCore::wire16(void* dst, int64_t nd, const void* src, int64_t ns, const std::function<void(void*, const void*, DType)>& op) {
  if (!amp_) {
    op(dst, src, adt_);
    return;
  }
  const bool in_place = dst == src;
  Tensor s({std::max<int64_t>(ns, 1)}, MemCategory::CommBuffers, tracker_, amp_dt_, dev_);
  Tensor d = in_place ? Tensor() : Tensor({std::max<int64_t>(nd, 1)}, MemCategory::CommBuffers, tracker_, amp_dt_, dev_);
  if (ns > 0) dev_.narrow_half(s.u16(), static_cast<const float*>(src), ns, amp_hf_);  // exact: the values are 16-bit ones
  void* d16 = in_place ? s.raw() : d.raw();
  op(d16, s.raw(), amp_dt_);
  if (nd > 0) dev_.widen_half(static_cast<float*>(dst), static_cast<const uint16_t*>(d16), nd, amp_hf_);
}

void GptCore::drop_scratch() {
  DTLAB_CHECK(std::none_of(busy_.begin(), busy_.end(), [](char b) { return b != 0; }), "a GPT op's float32 scratch is still in use");
  pool_.clear();
  busy_.clear();
}

std::array<std::vector<Tensor>*, 13> GptCore::per_block() {
  return {&ln1_, &ln1_mean_, &ln1_rstd_, &qkv_, &att_, &atty_, &res2_, &ln2_, &ln2_mean_, &ln2_rstd_, &fch_, &fch_gelu_, &res3_};
}

void GptCore::release() {
  for (auto* v : per_block()) v->clear();
  for (auto* v : {&moe_logits_, &moe_x_, &moe_y_, &cp_lse_, &cp_qkv_}) v->clear();
  routes_.clear();  // (moe_stats_ stay: the Experts view reads a released micro-batch's routing)
  for (Tensor* t : {&cp_a_, &cp_b_, &cp_c_, &cp_d_, &cp_y_, &moe_dx_, &encoded_, &lnf_, &lnf_mean_, &lnf_rstd_, &logits_, &dres_, &dbuf_, &dqkv_, &dfch_, &datt_, &full_, &perm_,
                    &dfull_, &dloc_, &lnf_full_, &dlogits_local_, &part_, &wte_part_, &moe_part_, &dlogits_kept_, &lora_t_, &lora_u_,
                    &lora_dx_, &lora_part_, &tokens_, &logits32_, &dlogits16_, &dy16_})
    *t = Tensor();
  douts_.clear();
  pool_.clear();
  busy_.clear();
  capacity_ = 0;
  B_ = 0;
  idx_ = nullptr;
  x_ = nullptr;
}

void GptCore::ensure(int64_t B) {
  B_ = B;
  if (B <= capacity_ && checkpointed_alloc_ == checkpointing_) return;
  // T: this rank's positions per sample (all of them, or T/c under context parallelism).
  const int64_t T = seq_rows(), C = s_.embd, BT = B * T, L = r_.end_block(s_) - r_.first_block();
  const int64_t R = residual_rows(B), Ct = C / tp_.degree, H = s_.heads / tp_.degree;  // this rank's rows, width, heads
  const int64_t Tw = s_.ctx, c = s_.cp.degree;  // the whole sequence, the CP degree
  // In the layers' dtype, but LayerNorm's statistics (float32 in every precision).
  auto act = [&](Shape shape) { return Tensor(std::move(shape), MemCategory::Activations, tracker_, adt_, dev_); };
  auto stat = [&](Shape shape) { return Tensor(std::move(shape), MemCategory::Activations, tracker_, DType::F32, dev_); };
  for (auto* v : per_block()) v->clear();
  encoded_ = r_.embeds() ? act({R, C}) : Tensor();
  // (Not counted as activations: torch's input tensor is the caller's too.)
  tokens_ = r_.embeds() ? Tensor({B * Tw}, MemCategory::Activations, nullptr, DType::I64, dev_) : Tensor();
  cp_lse_.clear();
  cp_qkv_.clear();
  for (auto* v : {&moe_logits_, &moe_x_, &moe_y_}) v->clear();
  // MoE blocks: their experts' rows are the (token, expert) pairs, R x K at most (the router sees this
  // rank's residual rows: its positions under sequence parallelism).
  const int64_t E = s_.moe.experts, N = R * s_.moe.top_k;
  bool any_moe = false, any_dense = false;
  for (int l = r_.first_block(); l < r_.end_block(s_); l++) (moe_block(l) ? any_moe : any_dense) = true;
  for (int64_t l = 0; l < L; l++) {
    res3_.push_back(act({R, C}));
    if (checkpointing_ && l > 0) continue;  // one set of the blocks' inner buffers, shared
    const bool m = checkpointing_ ? any_moe : moe_block(r_.first_block() + static_cast<int>(l));
    const bool d = checkpointing_ ? any_dense : !m;
    ln1_.push_back(act({R, C}));
    ln1_mean_.push_back(stat({R}));
    ln1_rstd_.push_back(stat({R}));
    qkv_.push_back(act({BT, 3 * Ct}));
    // The attention probabilities: (B, H, T, T); ring attention keeps each query's log-sum-exp instead,
    // Ulysses the probabilities of its H/c heads over the whole sequence and those heads' q, k, v.
    if (!cp()) {
      att_.push_back(act({B, H, T, T}));
    } else if (s_.cp.ring()) {
      att_.push_back(Tensor());
      cp_lse_.push_back(stat({B, H, T}));
    } else {
      att_.push_back(act({B, H / c, Tw, Tw}));
      cp_qkv_.push_back(act({B * Tw, 3 * Ct / c}));
    }
    atty_.push_back(act({BT, Ct}));
    res2_.push_back(act({R, C}));
    ln2_.push_back(act({R, C}));
    ln2_mean_.push_back(stat({R}));
    ln2_rstd_.push_back(stat({R}));
    // c_fc's output: this rank's 4C/t columns of every row, or each routed pair's whole expert (4C);
    // in elements, x 4.
    const int64_t hidden = std::max(d ? BT * Ct : 0, m ? N * C : 0);
    fch_.push_back(act({hidden, 4}));
    fch_gelu_.push_back(act({hidden, 4}));
    moe_logits_.push_back(m ? act({R, E}) : Tensor());
    moe_x_.push_back(m ? act({N, C}) : Tensor());
    moe_y_.push_back(m ? act({N, C}) : Tensor());
  }
  routes_.clear();
  routes_.resize(moe_logits_.size());
  moe_stats_.assign(static_cast<size_t>(L), MoeRouting{});
  if (moe_history_->size() != static_cast<size_t>(L)) moe_history_->assign(static_cast<size_t>(L), {});  // kept over a reallocation
  moe_dx_ = any_moe ? act({N, C}) : Tensor();
  if (r_.heads(s_)) {
    lnf_ = act({R, C});
    lnf_mean_ = stat({R});
    lnf_rstd_ = stat({R});
    logits_ = act({BT, s_.vocab});
    logits32_ = half() ? stat({BT, s_.vocab}) : Tensor();  // the loss's float32 copy
    dlogits16_ = half() || amp_ ? act({BT, s_.vocab}) : Tensor();  // the loss's gradient rounded (backward)
  }
  dres_ = act({R, C});
  dy16_ = amp_ ? act({R, C}) : Tensor();
  dbuf_ = act({BT, C});
  dqkv_ = act({BT, 3 * Ct});
  dfch_ = act({any_moe ? std::max(BT * Ct, N * C) : BT * Ct, 4});
  datt_ = stat({Tw, Tw});
  // Context parallelism's travelling blocks (ring: K/V and dK/dV, (B, T/c, 2C/t) each, twice) or
  // all-to-all buffers (Ulysses: (B, T/c, 3C/t) each way, and the head split's output (B, T, C/tc)).
  for (Tensor* t : {&cp_a_, &cp_b_, &cp_c_, &cp_d_, &cp_y_}) *t = Tensor();
  if (cp()) {
    auto comm = [&](int64_t n) { return Tensor({n}, MemCategory::CommBuffers, tracker_, adt_, dev_); };
    const int64_t w = s_.cp.ring() ? 2 * Ct : 3 * Ct;
    cp_a_ = comm(BT * w);
    cp_b_ = comm(BT * w);
    if (s_.cp.ring()) {
      cp_c_ = comm(BT * w);
      cp_d_ = comm(BT * w);
    } else {
      cp_y_ = act({B * Tw, Ct / c});
    }
  }
  cp_passes_.assign(static_cast<size_t>(L), CpPass{});
  cp_prev_passes_.assign(static_cast<size_t>(L), CpPass{});
  if (sp()) {
    full_ = act({BT, C});
    perm_ = act({BT, C});
    dfull_ = act({BT, C});
    dloc_ = act({R, C});
    auto scratch = [&](int64_t n) { return Tensor({n}, MemCategory::Gradients, tracker_, adt_, dev_); };
    part_ = scratch(std::max(r_.embeds() ? Tw * C : 0, 2 * C));
    // An MoE block's router and experts are whole on every TP rank and saw its positions: their
    // gradients are summed over the group, the router's and each expert's in turn.
    moe_part_ = any_moe ? scratch(std::max(E * C, 8 * C * C + 5 * C)) : Tensor();
    if (r_.heads(s_)) {
      lnf_full_ = act({BT, C});
      dlogits_local_ = act({R, s_.vocab});
    }
    if (r_.heads(s_) || r_.embeds()) wte_part_ = scratch(s_.vocab * C);
  }
  // LoRA's scratch, where a block here carries an adapter (a pipeline stage LoRA leaves alone has none).
  const bool adapted = frozen() && std::any_of(lora_.a_of_block.begin(), lora_.a_of_block.end(), [](int a) { return a >= 0; });
  if (adapted) {
    const int64_t r = lora_.rank;
    lora_t_ = act({2 * BT * r});
    lora_u_ = act({BT, 3 * Ct});
    lora_dx_ = act({BT, C});
    if (tp()) lora_part_ = Tensor({r * C}, MemCategory::Gradients, tracker_, adt_, dev_);
  }
  capacity_ = B;
  checkpointed_alloc_ = checkpointing_;
}

void GptCore::lora_forward(int l, void* out, const void* in) {
  const std::vector<Parameter>& ad = *lora_.params;
  const Parameter& A = ad[static_cast<size_t>(adapter(l))];
  const Parameter& Bm = ad[static_cast<size_t>(adapter(l) + 1)];
  const int64_t BT = B_ * seq_rows(), C = s_.embd, O = 3 * C / tp_.degree, r = lora_.rank;
  void* t = lora_t_.raw();
  void* u = lora_u_.raw();
  dev_.linear_forward(out16(t, BT * r), cast16(in, BT * C), cw(A), nullptr, BT, C, r);
  dev_.linear_forward(out16(u, BT * O), rd(t, BT * r), cw(Bm), nullptr, BT, r, O);
  dev_.scale(upd16(u, BT * O), BT * O, lora_.scaling);
  dev_.accumulate(upd16(out, BT * O), rd(u, BT * O), BT * O, false);
}

void GptCore::lora_backward(int l, void* dinp, const void* dout, const void* in, bool weights, int layer) {
  const std::vector<Parameter>& ad = *lora_.params;
  const Parameter& A = ad[static_cast<size_t>(adapter(l))];
  const Parameter& Bm = ad[static_cast<size_t>(adapter(l) + 1)];
  const int64_t BT = B_ * seq_rows(), C = s_.embd, O = 3 * C / tp_.degree, r = lora_.rank;
  // Every rank's dt covers its own heads' outputs: under TP, A's gradient is a partial sum.
  const bool part = weights && tp();
  if (part) dev_.fill_zero(lora_part_.raw(), lora_part_.nbytes());
  void* t = lora_t_.raw();
  void* dt = at(t, BT * r);
  if (weights) dev_.linear_forward(out16(t, BT * r), cast16(in, BT * C), cw(A), nullptr, BT, C, r);
  void* ds = lora_u_.raw();
  dev_.scale_copy(out16(ds, BT * O), rd(dout, BT * O), BT * O, lora_.scaling);
  dev_.linear_backward(out16(dt, BT * r), cg(weights ? &Bm : nullptr), nullptr, rd(ds, BT * O), rd(weights ? t : nullptr, BT * r),
                       cw(Bm), BT, r, O);
  void* dx = dinp ? lora_dx_.raw() : nullptr;
  dev_.linear_backward(out16(dx, BT * C), part ? cacc(lora_part_.raw(), lora_part_.numel()) : cg(weights ? &A : nullptr), nullptr,
                       rd(dt, BT * r), cast16(weights ? in : nullptr, BT * C), cw(A), BT, C, r);
  if (dx) dev_.accumulate(acc(dinp, BT * C), rd(dx, BT * C), BT * C, false);
  if (part) add_group_sum(lora_part_.raw(), layer, {{&A, r * C}});
}

double GptCore::layer_flops(int layer, int64_t B) const {
  // (Context parallelism: this rank's B T/c queries against the whole sequence's keys.)
  const double BT = static_cast<double>(B * seq_rows()), C = static_cast<double>(s_.embd), T = static_cast<double>(s_.ctx);
  if (layer == 0) return BT * C;  // the embedding sum
  if (layer == s_.layers + 1) return 2.0 * BT * C * static_cast<double>(s_.vocab) + 8.0 * BT * C;
  // c_attn, c_proj, c_fc, c_proj: 2 BT (3C^2 + C^2 + 4C^2 + 4C^2); attention: q.k and a.v over the
  // causal half, 2 x 2 x B x T x T/2 x C. A TP shard does 1/t of both.
  const double t = tp_.degree;
  if (moe_block(layer - 1)) {  // c_attn, c_proj and attention; the router; each token's K experts (before drops)
    // (Under TP, sequence parallel: 1/t of the heads, and the router and experts on 1/t of the positions.)
    const double E = static_cast<double>(s_.moe.experts), K = static_cast<double>(s_.moe.top_k);
    return (2.0 * BT * 4.0 * C * C + 2.0 * BT * T * C + 2.0 * BT * C * E + 2.0 * BT * K * 8.0 * C * C + 16.0 * BT * C) / t;
  }
  return (2.0 * BT * 12.0 * C * C + 2.0 * BT * T * C) / t + 16.0 * BT * C;
}

// ---- mixture of experts (MoeSpec; Megatron-core's router and token dispatcher) ----

const GptCore::MoeRouting* GptCore::moe_routing(int l) const {
  if (l < r_.first_block() || l >= r_.end_block(s_) || !moe_block(l) || local(l) >= moe_stats_.size()) return nullptr;
  const MoeRouting& m = moe_stats_[local(l)];
  return m.tokens > 0 ? &m : nullptr;
}

const std::vector<GptCore::MoePoint>* GptCore::moe_history(int l) const {
  if (l < r_.first_block() || l >= r_.end_block(s_) || !moe_block(l) || local(l) >= moe_history_->size()) return nullptr;
  return &(*moe_history_)[local(l)];
}

double GptCore::aux_loss() const {
  double sum = 0;
  for (const MoeRouting& m : moe_stats_) sum += m.aux_loss;
  return sum;
}

void GptCore::route(MoeRoute& rt, MoeRouting& st, const float* logits, int64_t BT) {
  const int64_t E = s_.moe.experts, K = s_.moe.top_k;
  rt.expert.assign(static_cast<size_t>(BT * K), 0);
  rt.prob.assign(static_cast<size_t>(BT * K), 0.0f);
  rt.kept.assign(static_cast<size_t>(BT * K), 1);
  rt.scores.assign(static_cast<size_t>(BT * E), 0.0f);
  st = MoeRouting{};
  st.tokens = BT;
  st.routed.assign(static_cast<size_t>(E), 0);
  st.kept.assign(static_cast<size_t>(E), 0);
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < BT; t++) {
    const float* z = logits + t * E;
    // torch.topk(logits, K): the K largest, a tie to the lower index.
    for (int32_t e = 0; e < E; e++) order[static_cast<size_t>(e)] = e;
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
    // softmax over the K chosen logits, in float32 (moe_router_pre_softmax off).
    const float top = z[order[0]];
    float sum = 0;
    for (int64_t k = 0; k < K; k++) sum += rt.prob[static_cast<size_t>(t * K + k)] = std::exp(z[order[static_cast<size_t>(k)]] - top);
    for (int64_t k = 0; k < K; k++) {
      rt.prob[static_cast<size_t>(t * K + k)] /= sum;
      rt.expert[static_cast<size_t>(t * K + k)] = order[static_cast<size_t>(k)];
      st.routed[static_cast<size_t>(order[static_cast<size_t>(k)])]++;
    }
    // softmax over all E logits: the aux loss's router probabilities.
    float mx = z[0];
    for (int64_t e = 1; e < E; e++) mx = std::max(mx, z[e]);
    float all = 0;
    float* sc = rt.scores.data() + t * E;
    for (int64_t e = 0; e < E; e++) all += sc[e] = std::exp(z[e] - mx);
    for (int64_t e = 0; e < E; e++) sc[e] /= all;
  }
  // Capacity (Megatron's get_capacity over the B x T x K choices), the tokens past it dropped in
  // token order (drop policy "position"): their probability is zeroed, not spread over the others.
  st.capacity = s_.moe.capacity > 0 ? static_cast<int64_t>(std::ceil(static_cast<double>(BT * K) / static_cast<double>(E) * s_.moe.capacity)) : 0;
  std::vector<int64_t> taken(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < BT * K; i++) {
    const size_t e = static_cast<size_t>(rt.expert[static_cast<size_t>(i)]);
    if (st.capacity > 0 && taken[e] >= st.capacity) {
      rt.kept[static_cast<size_t>(i)] = 0;
      st.dropped++;
      continue;
    }
    taken[e]++;
  }
  st.kept = taken;
  // The permutation: each expert's rows together, in token order (Megatron's permute).
  rt.offset.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; e++) rt.offset[static_cast<size_t>(e + 1)] = rt.offset[static_cast<size_t>(e)] + taken[static_cast<size_t>(e)];
  rt.row.assign(static_cast<size_t>(rt.offset.back()), 0);
  std::vector<int64_t> fill(rt.offset.begin(), rt.offset.end() - 1);
  for (int64_t i = 0; i < BT * K; i++)
    if (rt.kept[static_cast<size_t>(i)]) rt.row[static_cast<size_t>(fill[static_cast<size_t>(rt.expert[static_cast<size_t>(i)])]++)] = static_cast<int32_t>(i);
  // Switch's load-balancing loss (switch_load_balancing_loss_func): E x A / (K x T^2) x sum_e P_e x f_e,
  // P_e the router probabilities summed over the tokens, f_e the tokens routed before capacity. Under
  // TP (sequence parallel) and CP each rank routes its own positions: moe_group_sums() makes f_e and
  // T the group's (Megatron's tp_cp group), as the same model on one rank counts them.
  rt.prob_sum.assign(static_cast<size_t>(E), 0.0);
  rt.group_routed.assign(static_cast<size_t>(E), 0.0);
  for (int64_t e = 0; e < E; e++) {
    double pe = 0;
    for (int64_t t = 0; t < BT; t++) pe += rt.scores[static_cast<size_t>(t * E + e)];
    rt.prob_sum[static_cast<size_t>(e)] = pe;
    rt.group_routed[static_cast<size_t>(e)] = static_cast<double>(st.routed[static_cast<size_t>(e)]);
  }
  rt.group_tokens = static_cast<double>(BT);
  st.aux_loss = aux_loss_of(rt, rt.prob_sum);
}

double GptCore::aux_loss_of(const MoeRoute& rt, const std::vector<double>& prob_sum) const {
  const double E = static_cast<double>(s_.moe.experts), K = static_cast<double>(s_.moe.top_k), T = rt.group_tokens;
  double sum = 0;
  for (size_t e = 0; e < prob_sum.size(); e++) sum += prob_sum[e] * rt.group_routed[e];
  return sum * E * s_.moe.aux / (K * T * T);
}

void GptCore::moe_group_sums(MoeRoute& rt, MoeRouting& st, int layer) {
  // One all-reduce of 2E floats over the TP group, then one over the CP group: each expert's routed
  // tokens (the aux loss's f_e, which its gradient uses) and router probabilities (its value).
  const int64_t E = s_.moe.experts;
  std::vector<float> v(static_cast<size_t>(2 * E));
  for (int64_t e = 0; e < E; e++) {
    v[static_cast<size_t>(e)] = static_cast<float>(st.routed[static_cast<size_t>(e)]);
    v[static_cast<size_t>(E + e)] = static_cast<float>(rt.prob_sum[static_cast<size_t>(e)]);
  }
  Tensor buf({2 * E}, MemCategory::Other, nullptr, DType::F32, dev_);
  dev_.upload(buf.raw(), v.data(), 2 * E * static_cast<int64_t>(sizeof(float)));
  if (tp()) comm_->all_reduce(buf.raw(), 2 * E, DType::F32, layer);
  if (cp()) {
    DTLAB_CHECK(cp_comm_ != nullptr, "a context-parallel GPT runs only after set_cp_comm()");
    cp_comm_->all_reduce(buf.raw(), 2 * E, DType::F32, layer);
  }
  dev_.download(v.data(), buf.raw(), 2 * E * static_cast<int64_t>(sizeof(float)));
  std::vector<double> probs(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; e++) {
    rt.group_routed[static_cast<size_t>(e)] = v[static_cast<size_t>(e)];
    probs[static_cast<size_t>(e)] = v[static_cast<size_t>(E + e)];
  }
  rt.group_tokens *= static_cast<double>(tp_.degree * s_.cp.degree);
  st.aux_loss = aux_loss_of(rt, probs);
}

std::vector<int64_t> GptCore::send_rows(const MoeRoute& rt) const {
  const int64_t El = s_.moe.local_experts();
  std::vector<int64_t> n(static_cast<size_t>(s_.moe.ep));
  for (int64_t j = 0; j < s_.moe.ep; j++) n[static_cast<size_t>(j)] = rt.offset[static_cast<size_t>((j + 1) * El)] - rt.offset[static_cast<size_t>(j * El)];
  return n;
}

std::vector<int64_t> GptCore::recv_rows(const MoeRoute& rt) const {
  const int64_t El = s_.moe.local_experts();
  std::vector<int64_t> n(static_cast<size_t>(s_.moe.ep), 0);
  for (int64_t i = 0; i < s_.moe.ep; i++)
    for (int64_t e = 0; e < El; e++) n[static_cast<size_t>(i)] += rt.from[static_cast<size_t>(i * El + e)];
  return n;
}

void GptCore::regroup(void* dst, const void* src, const MoeRoute& rt, int64_t width, bool to_expert) {
  const int64_t El = s_.moe.local_experts(), ep = s_.moe.ep;
  int64_t at_rank = 0;  // the row where rank i's rows start, in rank order
  std::vector<int64_t> fill(rt.eoff.begin(), rt.eoff.end() - 1);  // the next row of each expert, in expert order
  for (int64_t i = 0; i < ep; i++)
    for (int64_t e = 0; e < El; e++) {
      const int64_t n = rt.from[static_cast<size_t>(i * El + e)];
      const int64_t r = at_rank, x = fill[static_cast<size_t>(e)];
      if (n > 0) {
        if (to_expert) dev_.copy(at(dst, x * width), at(src, r * width), n * width * esz());
        else dev_.copy(at(dst, r * width), at(src, x * width), n * width * esz());
      }
      at_rank += n;
      fill[static_cast<size_t>(e)] += n;
    }
}

const void* GptCore::moe_forward(std::vector<Parameter>& p, int l, const void* a) {
  const int64_t BT = residual_rows(B_), C = s_.embd, E = s_.moe.experts, K = s_.moe.top_k, El = s_.moe.local_experts();
  const size_t k = slot(l);
  MoeRoute& rt = routes_[k];
  void* logits = moe_logits_[k].raw();
  dev_.linear_forward(out16(logits, BT * E), cast16(a, BT * C), cw(p[static_cast<size_t>(pr(l))]), nullptr, BT, C, E);  // the router
  {
    F32 z = rd(logits, BT * E);
    route(rt, moe_stats_[local(l)], Host(dev_, z, BT * E, true, false), BT);
  }
  if (tp() || cp()) moe_group_sums(rt, moe_stats_[local(l)], 1 + l);
  if (!recomputing_) {
    const MoeRouting& st = moe_stats_[local(l)];
    const double mean = static_cast<double>(BT * K) / static_cast<double>(E);
    const int64_t most = *std::max_element(st.routed.begin(), st.routed.end());
    std::vector<MoePoint>& h = (*moe_history_)[local(l)];
    if (h.size() == kMoeHistory) h.erase(h.begin());
    h.push_back({static_cast<float>(static_cast<double>(most) / mean), static_cast<float>(st.aux_loss)});
  }
  // Dispatch: each kept (token, expert) pair's input row, grouped by expert.
  void* x = moe_x_[k].raw();
  for (size_t n = 0; n < rt.row.size(); n++) dev_.copy(at(x, static_cast<int64_t>(n) * C), at(a, (rt.row[n] / K) * C), C * esz());
  void* y = moe_y_[k].raw();
  // The rows this rank's experts run, in expert order: its own (no EP), or every group rank's.
  const void* xr = x;
  void* hr = fch_[k].raw();
  void* gr = fch_gelu_[k].raw();
  void* yr = y;
  Tensor back;  // EP: the outputs in rank order, sent back
  if (!ep()) {
    rt.eoff = rt.offset;
  } else {
    DTLAB_CHECK(ep_comm_ != nullptr, "an expert-parallel GPT runs only after set_ep_comm()");
    const int layer = 1 + l;
    // The counts first (Megatron's all-to-all of tokens per expert), then the rows.
    Tensor mine({E}, MemCategory::Other, nullptr, DType::I64, dev_), theirs({E}, MemCategory::Other, nullptr, DType::I64, dev_);
    std::vector<int64_t> n(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; e++) n[static_cast<size_t>(e)] = rt.offset[static_cast<size_t>(e + 1)] - rt.offset[static_cast<size_t>(e)];
    dev_.upload(mine.raw(), n.data(), E * static_cast<int64_t>(sizeof(int64_t)));
    ep_comm_->all_to_all(theirs.raw(), mine.raw(), El, DType::I64, layer);
    rt.from.assign(static_cast<size_t>(E), 0);
    dev_.download(rt.from.data(), theirs.raw(), E * static_cast<int64_t>(sizeof(int64_t)));
    rt.eoff.assign(static_cast<size_t>(El + 1), 0);
    for (int64_t e = 0; e < El; e++) {
      int64_t rows = 0;
      for (int64_t i = 0; i < s_.moe.ep; i++) rows += rt.from[static_cast<size_t>(i * El + e)];
      rt.eoff[static_cast<size_t>(e + 1)] = rt.eoff[static_cast<size_t>(e)] + rows;
    }
    const int64_t R = rt.eoff.back();
    auto act = [&](int64_t w) { return Tensor({std::max<int64_t>(R, 1), w}, MemCategory::Activations, tracker_, adt_, dev_); };
    std::vector<int64_t> sc = send_rows(rt), rc = recv_rows(rt);
    for (auto& v : sc) v *= C;
    for (auto& v : rc) v *= C;
    back = Tensor({std::max<int64_t>(R, 1), C}, MemCategory::Other, nullptr, adt_, dev_);
    ep_comm_->all_to_all_v(back.raw(), rc, x, sc, adt_, layer);
    rt.ex_x = act(C);
    regroup(rt.ex_x.raw(), back.raw(), rt, C, true);
    rt.ex_h = act(4 * C);
    rt.ex_g = act(4 * C);
    xr = rt.ex_x.raw();
    hr = rt.ex_h.raw();
    gr = rt.ex_g.raw();
    yr = back.raw();  // (the received inputs are in ex_x now: back takes the outputs, in expert order)
  }
  for (int64_t e = 0; e < El; e++) {  // each of this rank's experts: nanoGPT's MLP on its rows
    const int64_t r0 = rt.eoff[static_cast<size_t>(e)], n = rt.eoff[static_cast<size_t>(e + 1)] - r0;
    if (n == 0) continue;
    auto w = [&](GptParamIndex::Expert j) -> const Parameter& { return p[static_cast<size_t>(pe(l, static_cast<int>(e), j))]; };
    dev_.linear_forward(out16(at(hr, r0 * 4 * C), n * 4 * C), cast16(at(xr, r0 * C), n * C), cw(w(GptParamIndex::ExFcW)),
                        cw(w(GptParamIndex::ExFcB)), n, C, 4 * C);
    dev_.gelu_forward(out16(at(gr, r0 * 4 * C), n * 4 * C), rd(at(hr, r0 * 4 * C), n * 4 * C), n * 4 * C);
    dev_.linear_forward(out16(at(yr, r0 * C), n * C), rd(at(gr, r0 * 4 * C), n * 4 * C), cw(w(GptParamIndex::ExProjW)),
                        cw(w(GptParamIndex::ExProjB)), n, 4 * C, C);
  }
  if (ep()) {  // the outputs (expert order in `back`) to their ranks, in rank order, into y: this rank's permuted rows
    std::vector<int64_t> sc = send_rows(rt), rc = recv_rows(rt);
    for (auto& v : sc) v *= C;
    for (auto& v : rc) v *= C;
    Tensor ranked({std::max<int64_t>(rt.eoff.back(), 1), C}, MemCategory::Other, nullptr, adt_, dev_);
    regroup(ranked.raw(), back.raw(), rt, C, false);
    const int64_t ns = std::accumulate(rc.begin(), rc.end(), int64_t{0}), nd = std::accumulate(sc.begin(), sc.end(), int64_t{0});
    wire16(y, nd, ranked.raw(), ns, [&](void* d, const void* s, DType dt) { ep_comm_->all_to_all_v(d, sc, s, rc, dt, 1 + l); });
  }
  // Combine: each token's kept outputs weighted by their probabilities, summed in expert order
  // (Megatron's unpermute: scatter_add of probs x rows); a dropped pair adds nothing.
  const int64_t rows = static_cast<int64_t>(rt.row.size());
  void* out = dbuf_.raw();
  {
    F32 o32 = wr(out, BT * C);
    F32 yy32 = rd(y, rows * C);
    Host o(dev_, o32, BT * C, false, true), yy(dev_, yy32, rows * C, true, false);
    std::fill_n(static_cast<float*>(o), BT * C, 0.0f);
    for (int64_t n = 0; n < rows; n++) {
      const int32_t i = rt.row[static_cast<size_t>(n)];
      const float pr_ = rt.prob[static_cast<size_t>(i)];
      float* dst = static_cast<float*>(o) + (i / K) * C;
      const float* src = static_cast<float*>(yy) + n * C;
      for (int64_t c = 0; c < C; c++) dst[c] += pr_ * src[c];
    }
  }
  return out;
}

void GptCore::moe_backward(std::vector<Parameter>& p, int l, const void* a, const void* dout, const std::function<void(int)>& ready) {
  using P = GptParamIndex;
  const int64_t BT = residual_rows(B_), C = s_.embd, E = s_.moe.experts, K = s_.moe.top_k;
  const size_t k = slot(l);
  MoeRoute& rt = routes_[k];
  const int64_t rows = static_cast<int64_t>(rt.row.size());
  void* y = moe_y_[k].raw();
  // d prob for each kept pair (dout . its expert's output), then y's buffer takes prob x dout.
  std::vector<float> dprob(static_cast<size_t>(BT * K), 0.0f);
  {
    F32 d32 = rd(dout, BT * C);
    F32 yy32 = acc(y, rows * C);
    Host d(dev_, d32, BT * C, true, false), yy(dev_, yy32, rows * C, true, true);
    for (int64_t n = 0; n < rows; n++) {
      const int32_t i = rt.row[static_cast<size_t>(n)];
      const float* dt = static_cast<float*>(d) + (i / K) * C;
      float* yr = static_cast<float*>(yy) + n * C;
      double dot = 0;
      for (int64_t c = 0; c < C; c++) dot += static_cast<double>(dt[c]) * yr[c];
      dprob[static_cast<size_t>(i)] = static_cast<float>(dot);
      const float pr_ = rt.prob[static_cast<size_t>(i)];
      for (int64_t c = 0; c < C; c++) yr[c] = pr_ * dt[c];
    }
  }
  if (amp_) dev_.round_half(static_cast<float*>(y), rows * C, amp_hf_);  // the gradient reaching the experts' 16-bit outputs
  // This rank's experts' rows (expert order): its own, or under EP every group rank's, whose output
  // gradients come over as the outputs went back, and whose input gradients return as the inputs came.
  void* dx = moe_dx_.raw();
  const void* xr = moe_x_[k].raw();
  const void* hr = fch_[k].raw();
  const void* gr = fch_gelu_[k].raw();
  void* dyr = y;
  void* dxr = dx;
  const int64_t R = rt.eoff.back();
  Tensor ranked, dy_ex, dx_ex;
  std::vector<int64_t> sc, rc;
  if (ep()) {
    sc = send_rows(rt);
    rc = recv_rows(rt);
    for (auto& v : sc) v *= C;
    for (auto& v : rc) v *= C;
    auto scratch = [&](int64_t w) { return Tensor({std::max<int64_t>(R, 1), w}, MemCategory::Other, nullptr, adt_, dev_); };
    ranked = scratch(C);
    const int64_t nd = std::accumulate(rc.begin(), rc.end(), int64_t{0}), ns = std::accumulate(sc.begin(), sc.end(), int64_t{0});
    wire16(ranked.raw(), nd, y, ns, [&](void* d, const void* s, DType dt) { ep_comm_->all_to_all_v(d, rc, s, sc, dt, 1 + l); });
    dy_ex = scratch(C);
    regroup(dy_ex.raw(), ranked.raw(), rt, C, true);
    dx_ex = scratch(C);
    xr = rt.ex_x.raw();
    hr = rt.ex_h.raw();
    gr = rt.ex_g.raw();
    dyr = dy_ex.raw();
    dxr = dx_ex.raw();
  }
  Tensor dh_big;  // c_proj's input gradient: dfch_ holds B x T x K rows, EP may bring more
  void* dh = dfch_.raw();
  if (R > dfch_.numel() / (4 * C)) {
    dh_big = Tensor({R, 4 * C}, MemCategory::Other, nullptr, adt_, dev_);
    dh = dh_big.raw();
  }
  auto grad = [&](int i) { return &p[static_cast<size_t>(i)]; };
  const int layer = 1 + l;
  // Under TP (sequence parallel) the router and the experts are whole on every rank of the group and
  // saw its positions only: each one's gradient is computed apart and summed over the group (as the
  // LayerNorms' are; Megatron reduces them over the expert-data-parallel group, which holds the TP ranks).
  // Under EP as well the TP ranks hold different experts: the trainer sums each over its holders.
  const bool frozen_experts = half() ? !p[static_cast<size_t>(pr(l))].grad16 : !p[static_cast<size_t>(pr(l))].grad;  // (LoRA)
  const bool summed = tp() && !frozen_experts, experts_summed = summed && !ep();
  for (int64_t e = s_.moe.local_experts() - 1; e >= 0; e--) {  // from the last: c_proj, GELU, c_fc
    const int64_t r0 = rt.eoff[static_cast<size_t>(e)], n = rt.eoff[static_cast<size_t>(e + 1)] - r0;
    const int ie = static_cast<int>(e);
    const Parameter* g[4] = {grad(pe(l, ie, P::ExProjW)), grad(pe(l, ie, P::ExProjB)), grad(pe(l, ie, P::ExFcW)), grad(pe(l, ie, P::ExFcB))};
    void* part = moe_part_.raw();  // under TP: c_proj's weight and bias, then c_fc's
    const int64_t len[4] = {4 * C * C, C, 4 * C * C, 4 * C};
    if (experts_summed) dev_.fill_zero(part, (8 * C * C + 5 * C) * esz());
    auto into = [&](int j) -> F32 {
      if (!experts_summed) return cg(g[j]);
      int64_t off = 0;
      for (int i = 0; i < j; i++) off += len[i];
      return cacc(at(part, off), len[j]);
    };
    if (n > 0) {
      const Parameter& wp = p[static_cast<size_t>(pe(l, ie, P::ExProjW))];
      const Parameter& wf = p[static_cast<size_t>(pe(l, ie, P::ExFcW))];
      dev_.linear_backward(out16(dh, n * 4 * C), into(0), into(1), rd(at(dyr, r0 * C), n * C), rd(at(gr, r0 * 4 * C), n * 4 * C), cw(wp),
                           n, 4 * C, C);
      dev_.gelu_backward(out16(dh, n * 4 * C), rd(dh, n * 4 * C), rd(at(hr, r0 * 4 * C), n * 4 * C), n * 4 * C);
      dev_.linear_backward(out16(at(dxr, r0 * C), n * C), into(2), into(3), rd(dh, n * 4 * C), cast16(at(xr, r0 * C), n * C), cw(wf), n, C,
                           4 * C);
    }
    if (experts_summed) add_group_sum(part, layer, {{g[0], len[0]}, {g[1], len[1]}, {g[2], len[2]}, {g[3], len[3]}});
    if (ready) {  // (an expert no token reached has a zero gradient, final too)
      for (P::Expert j : {P::ExProjB, P::ExProjW, P::ExFcB, P::ExFcW}) ready(pe(l, ie, j));
    }
  }
  if (ep()) {  // the input gradients back to their ranks: this rank's permuted rows' into moe_dx_
    regroup(ranked.raw(), dx_ex.raw(), rt, C, false);
    ep_comm_->all_to_all_v(dx, sc, ranked.raw(), rc, adt_, 1 + l);
  }
  // The router's logits' gradient: the top-k softmax's (a dropped pair's probability was masked, so
  // its gradient is zero), plus the aux loss's through the softmax over all experts.
  // The aux loss's f_e and token count are the TP and CP group's (moe_group_sums). Each CP rank's
  // gradient is its share of the group's, which the data-parallel average over dp x cp divides by cp
  // (the cross-entropy's is its positions' mean, cp times its share): it is multiplied back here.
  std::vector<float> dz(static_cast<size_t>(BT * E), 0.0f);
  const double coef = static_cast<double>(E) * s_.moe.aux / (static_cast<double>(K) * rt.group_tokens * rt.group_tokens) *
                      static_cast<double>(aux_grad_scale_) * static_cast<double>(s_.cp.degree);
  for (int64_t t = 0; t < BT; t++) {
    float* dzt = dz.data() + t * E;
    double dot = 0;
    for (int64_t j = 0; j < K; j++) {
      const size_t i = static_cast<size_t>(t * K + j);
      if (!rt.kept[i]) dprob[i] = 0;
      dot += static_cast<double>(rt.prob[i]) * dprob[i];
    }
    for (int64_t j = 0; j < K; j++) {
      const size_t i = static_cast<size_t>(t * K + j);
      dzt[rt.expert[i]] += static_cast<float>(rt.prob[i] * (dprob[i] - dot));
    }
    if (s_.moe.aux > 0) {
      const float* sc = rt.scores.data() + t * E;
      double sg = 0;
      for (int64_t e = 0; e < E; e++) sg += static_cast<double>(sc[e]) * coef * rt.group_routed[static_cast<size_t>(e)];
      for (int64_t e = 0; e < E; e++) dzt[e] += static_cast<float>(sc[e] * (coef * rt.group_routed[static_cast<size_t>(e)] - sg));
    }
  }
  void* dlog = moe_logits_[k].raw();  // (the logits are spent: their buffer takes their gradient)
  {
    F32 d = out16(dlog, BT * E);  // (autocast: the 16-bit logits' gradient)
    dev_.upload(d, dz.data(), BT * E * static_cast<int64_t>(sizeof(float)));
  }
  // The gradient of `a`: the experts' input gradients added back to their tokens, then the router's.
  void* da = dbuf_.raw();
  {
    F32 o32 = wr(da, BT * C);
    F32 xs32 = rd(dx, rows * C);
    Host o(dev_, o32, BT * C, false, true), xs(dev_, xs32, rows * C, true, false);
    std::fill_n(static_cast<float*>(o), BT * C, 0.0f);
    for (int64_t n = 0; n < rows; n++) {
      float* dst = static_cast<float*>(o) + (rt.row[static_cast<size_t>(n)] / K) * C;
      const float* src = static_cast<float*>(xs) + n * C;
      for (int64_t c = 0; c < C; c++) dst[c] += src[c];
    }
  }
  if (summed) {
    void* part = moe_part_.raw();
    dev_.fill_zero(part, E * C * esz());
    dev_.linear_backward(out16(dx, BT * C), cacc(part, E * C), nullptr, rd(dlog, BT * E), cast16(a, BT * C), cw(p[static_cast<size_t>(pr(l))]),
                         BT, C, E);
    add_group_sum(part, layer, {{grad(pr(l)), E * C}});
  } else {
    dev_.linear_backward(out16(dx, BT * C), cg(grad(pr(l))), nullptr, rd(dlog, BT * E), cast16(a, BT * C), cw(p[static_cast<size_t>(pr(l))]),
                         BT, C, E);
  }
  dev_.accumulate(acc(da, BT * C), rd(dx, BT * C), BT * C, false);
  if (ready) ready(pr(l));
}

OpCost GptCore::layer_cost(int layer, int64_t B) const {
  // (Context parallelism: this rank's B T/c queries against the whole sequence's keys.)
  const double BT = static_cast<double>(B * seq_rows()), C = static_cast<double>(s_.embd), T = static_cast<double>(s_.ctx);
  const double V = static_cast<double>(s_.vocab), t = tp_.degree, H = static_cast<double>(s_.heads) / t;
  double elems;
  if (layer == 0) elems = 2 * BT * C + T * C + 2 * BT;  // wte rows and wpe read, the sum written; the ids (int64)
  else if (layer == s_.layers + 1) elems = 3 * BT * C + V * C + BT * V;  // ln_f, then lm_head's input, W and logits
  // ln_1, c_attn, attention (q k v in, y out; the scores written, softmaxed in place and read by a.v),
  // c_proj, the residual add, ln_2, c_fc, GELU, c_proj, the residual add; a TP shard's share of the
  // split ones.
  else if (moe_block(layer - 1)) {
    // The same attention half; then the router (C in, E logits out), the dispatch and combine copies
    // (K rows each way), and each token's K experts' c_fc, GELU and c_proj as a dense block's MLP;
    // the weights: attention's 4C^2, the router's EC and every expert's 8C^2 (one pass reads them all).
    const double E = static_cast<double>(s_.moe.experts), K = static_cast<double>(s_.moe.top_k);
    elems = (BT * C * (14 + 6) + BT * (C + E) + K * BT * C * (18 + 4) + 4 * C * C) / t + E * C + E * 8 * C * C +
            4 * static_cast<double>(B) * H * T * T;
  } else {
    elems = BT * C * (14 + 24 / t) + 12 * C * C / t + 4 * static_cast<double>(B) * H * T * T;
  }
  return {layer_flops(layer, B), kCostElemBytes * elems};
}

bool GptCore::attention(int l, int64_t b, int64_t h, std::vector<float>& probs) const {
  const int64_t H = s_.heads / tp_.degree, mine = h - tp_.rank * H;  // this rank's heads are [rank H, rank H + H)
  if (B_ == 0 || checkpointing_ || cp() || l < r_.first_block() || l >= r_.end_block(s_) || b < 0 || b >= B_ || mine < 0 || mine >= H)
    return false;
  const int64_t TT = s_.ctx * s_.ctx, first = (b * H + mine) * TT;
  probs.resize(static_cast<size_t>(TT));
  if (half()) download_half(dev_, probs.data(), att_[local(l)].u16() + first, TT, hf_);
  else dev_.download(probs.data(), att_[local(l)].f32() + first, TT * static_cast<int64_t>(sizeof(float)));
  return true;
}

const void* GptCore::seq_gather(void* full, const void* local, int64_t w, int layer, bool is16) {
  const int64_t t = tp_.degree, B = B_, T = seq_rows(), Tl = T / t;
  void* g = perm_.raw();  // rank r's rows of every sample, then rank r + 1's
  const auto gather = [&](void* d, const void* s, DType dt) { comm_->all_gather(d, s, B * Tl * w, dt, layer); };
  if (is16) wire16(g, t * B * Tl * w, local, B * Tl * w, gather);
  else gather(g, local, adt_);
  for (int64_t r = 0; r < t; r++)
    for (int64_t b = 0; b < B; b++) dev_.copy(at(full, (b * T + r * Tl) * w), at(g, (r * B + b) * Tl * w), Tl * w * esz());
  return full;
}

void GptCore::seq_reduce_scatter(void* local, const void* full, int64_t w, int layer, bool is16) {
  const int64_t t = tp_.degree, B = B_, T = seq_rows(), Tl = T / t;
  void* g = perm_.raw();
  for (int64_t r = 0; r < t; r++)
    for (int64_t b = 0; b < B; b++) dev_.copy(at(g, (r * B + b) * Tl * w), at(full, (b * T + r * Tl) * w), Tl * w * esz());
  const auto scatter = [&](void* d, const void* s, DType dt) { comm_->reduce_scatter(d, s, B * Tl * w, dt, layer); };
  if (is16) wire16(local, B * Tl * w, g, t * B * Tl * w, scatter);
  else scatter(local, g, adt_);
}

void GptCore::seq_rows(void* local, const void* full, int64_t w, int64_t es) const {
  const int64_t B = B_, T = seq_rows(), Tl = T / tp_.degree;
  for (int64_t b = 0; b < B; b++)
    dev_.copy(static_cast<char*>(local) + b * Tl * w * es, static_cast<const char*>(full) + (b * T + tp_.rank * Tl) * w * es, Tl * w * es);
}

const void* GptCore::row_parallel(const void* in, const Parameter& w, const Parameter& b, int64_t width, int layer) {
  const int64_t BT = B_ * seq_rows(), C = s_.embd, R = residual_rows(B_);
  void* out = dbuf_.raw();
  if (!tp()) {
    dev_.linear_forward(out16(out, BT * C), rd(in, BT * width), cw(w), cw(b), BT, width, C);
    return out;
  }
  dev_.linear_forward(out16(out, BT * C), rd(in, BT * width), cw(w), nullptr, BT, width, C);  // this rank's partial sums
  void* y = out;
  if (sp()) seq_reduce_scatter(y = dloc_.raw(), out, C, layer, true);
  else wire16(out, BT * C, out, BT * C, [&](void* d, const void*, DType dt) { comm_->all_reduce(d, BT * C, dt, layer); });
  // RowParallelLinear adds the bias after the sum (autocast: output_ + bias, a float32 add).
  dev_.add_rows(acc(y, R * C), pw(b), R, C);
  return y;
}

const void* GptCore::column_input_grad(void* d, int layer) {
  if (!tp()) return d;
  if (!sp()) {
    comm_->all_reduce(d, B_ * seq_rows() * s_.embd, adt_, layer);
    return d;
  }
  seq_reduce_scatter(dloc_.raw(), d, s_.embd, layer);
  return dloc_.raw();
}

void GptCore::ln_backward(std::vector<Parameter>& p, void* dinp, int wi, int bi, const void* dout, const void* inp,
                          const float* mean, const float* rstd, int layer) {
  const int64_t C = s_.embd, R = residual_rows(B_);
  const Parameter& w = p[static_cast<size_t>(wi)];
  const Parameter& b = p[static_cast<size_t>(bi)];
  const bool frozen_w = half() ? !w.grad16 : !w.grad;  // (a frozen LoRA base: no parameter gradients)
  if (!sp() || frozen_w) {
    dev_.layernorm_backward(acc(dinp, R * C), pg(&w), pg(&b), rd(dout, R * C), rd(inp, R * C), pw(w), mean, rstd, R, C);
    return;
  }
  void* part = part_.raw();  // weight's then bias's, summed in one all-reduce
  dev_.fill_zero(part, 2 * C * esz());
  dev_.layernorm_backward(acc(dinp, R * C), acc(part, C), acc(at(part, C), C), rd(dout, R * C), rd(inp, R * C), pw(w), mean, rstd,
                          R, C);
  add_group_sum(part, layer, {{&w, C}, {&b, C}});
}

void GptCore::add_group_sum(void* part, int layer, std::initializer_list<std::pair<const Parameter*, int64_t>> into) {
  int64_t n = 0;
  for (const auto& [q, len] : into) n += len;
  comm_->all_reduce(part, n, adt_, layer);
  for (const auto& [q, len] : into) {
    dev_.accumulate(pg(q), rd(part, len), len, false);
    part = at(part, len);
  }
}

template <class Fn>
void GptCore::position_runs(Fn fn) const {
  const int64_t Tl = residual_rows(B_) / B_, t0 = sp() ? tp_.rank * Tl : 0;
  const std::vector<int64_t>& pos = cp_pos_[static_cast<size_t>(s_.cp.rank)];
  for (int64_t i = 0; i < Tl;) {
    int64_t n = 1;
    while (i + n < Tl && pos[static_cast<size_t>(t0 + i + n)] == pos[static_cast<size_t>(t0 + i)] + n) n++;
    for (int64_t b = 0; b < B_; b++) fn(b, b * Tl + i, n, pos[static_cast<size_t>(t0 + i)]);
    i += n;
  }
}

void GptCore::block_forward(std::vector<Parameter>& p, int l, const void* x) {
  using P = GptParamIndex;
  const int64_t B = B_, T = seq_rows(), C = s_.embd, BT = B * T, R = residual_rows(B), Ct = C / tp_.degree;
  auto w = [&](P::Block b) -> const Parameter& { return p[static_cast<size_t>(pi(l, b))]; };
  const size_t k = slot(l);
  const int layer = 1 + l;
  dev_.layernorm_forward(wr(ln1_[k]), ln1_mean_[k].f32(), ln1_rstd_[k].f32(), rd(x, R * C), pw(w(P::Ln1W)), pw(w(P::Ln1B)), R, C);
  const void* a = sp() ? seq_gather(full_.raw(), ln1_[k].raw(), C, layer) : ln1_[k].raw();  // f
  dev_.linear_forward(out16(qkv_[k]), cast16(a, BT * C), cw(w(P::AttnW)), cw(w(P::AttnB)), BT, C, 3 * Ct);
  if (adapter(l) >= 0) lora_forward(l, qkv_[k].raw(), a);
  if (s_.cp.ring()) ring_attention_forward(k, l);
  else if (cp()) ulysses_forward(k, l);
  else dev_.attention_forward(out16(atty_[k]), out16(att_[k]), rd(qkv_[k]), B, T, Ct, s_.heads / tp_.degree, round16());
  const void* proj = row_parallel(atty_[k].raw(), w(P::AttnProjW), w(P::AttnProjB), Ct, layer);  // g
  void* r2 = res2_[k].raw();
  dev_.add(wr(r2, R * C), rd(x, R * C), rd(proj, R * C), R * C);
  dev_.layernorm_forward(wr(ln2_[k]), ln2_mean_[k].f32(), ln2_rstd_[k].f32(), rd(r2, R * C), pw(w(P::Ln2W)), pw(w(P::Ln2B)), R, C);
  if (moe_block(l)) {
    proj = moe_forward(p, l, ln2_[k].raw());  // (sequence parallel: this rank's positions, whole experts)
  } else {
    a = sp() ? seq_gather(full_.raw(), ln2_[k].raw(), C, layer) : ln2_[k].raw();
    dev_.linear_forward(out16(fch_[k].raw(), BT * 4 * Ct), cast16(a, BT * C), cw(w(P::FcW)), cw(w(P::FcB)), BT, C, 4 * Ct);
    dev_.gelu_forward(out16(fch_gelu_[k].raw(), BT * 4 * Ct), rd(fch_[k].raw(), BT * 4 * Ct), BT * 4 * Ct);
    proj = row_parallel(fch_gelu_[k].raw(), w(P::FcProjW), w(P::FcProjB), 4 * Ct, layer);
  }
  dev_.add(wr(res3_[local(l)]), rd(r2, R * C), rd(proj, R * C), R * C);
}

const void* GptCore::forward(std::vector<Parameter>& p, const int64_t* idx, int64_t B, ComputeObserver* obs, LayerGate* gate,
                             LayerHooks* hooks, const void* x_in) {
  using P = GptParamIndex;
  DTLAB_CHECK(r_.embeds() ? idx != nullptr : x_in != nullptr, "a GPT stage's forward needs its input: tokens where it embeds, else x");
  DTLAB_CHECK(!tp() || comm_ != nullptr, "a GPT tensor-parallel shard runs only after set_tp_comm()");
  ensure(B);
  if (r_.embeds()) {  // a copy: backward, attention() and tokens() never read a caller's buffer that is gone
    dev_.copy(tokens_.raw(), idx, B * s_.ctx * static_cast<int64_t>(sizeof(int64_t)));  // (every position, under CP too)
    idx = tokens_.i64();
  }
  idx_ = idx;
  x_ = x_in;
  const int64_t T = s_.ctx, C = s_.embd, BT = B * seq_rows(), V = s_.vocab, R = residual_rows(B);
  // This rank's positions: all, or under sequence parallelism [rank T/t, rank T/t + T/t) of each sample
  // (under context parallelism, of the CP rank's positions).
  const int64_t Tl = R / B, t0 = sp() ? tp_.rank * Tl : 0;
  const int L = static_cast<int>(s_.layers);
  auto w = [&](int i) -> const Parameter& { return p[static_cast<size_t>(i)]; };  // read after the layer's hooks (FSDP binds)
  auto enter = [&](int layer) {
    if (gate) gate->before_layer(layer, false);
    if (hooks) hooks->before_forward(layer);
  };
  if (r_.embeds()) {
    enter(0);
    {
      ComputeScope scope(obs, ComputeKind::LayerForward, 0, layer_cost(0, B));
      if (!cp()) {
        dev_.embedding_forward(wr(encoded_), pw(w(P::kWte)), pw(w(P::kWpe)), idx, R, Tl, T, t0, C);
      } else {  // each run of consecutive positions (zigzag's two chunks: two per sample)
        F32 x = wr(encoded_);
        F32 wte = pw(w(P::kWte)), wpe = pw(w(P::kWpe));
        position_runs([&](int64_t b, int64_t row, int64_t n, int64_t pos) {
          dev_.embedding_forward(static_cast<float*>(x) + row * C, wte, wpe, idx + b * T, n, n, T, pos, C);
        });
      }
    }
    if (hooks) hooks->after_forward(0);
  }
  const void* x = r_.embeds() ? encoded_.raw() : x_in;
  for (int l = r_.first_block(); l < r_.end_block(s_); l++) {
    enter(1 + l);
    std::optional<ComputeScope> scope(std::in_place, obs, ComputeKind::LayerForward, 1 + l, layer_cost(1 + l, B));
    block_forward(p, l, x);
    x = res3_[local(l)].raw();
    scope.reset();  // the hooks' collectives (FSDP's reshard) follow the layer, outside its span
    if (hooks) hooks->after_forward(1 + l);
  }
  if (!r_.heads(s_)) {
    drop_scratch();
    return x;
  }
  enter(L + 1);
  {
    ComputeScope scope(obs, ComputeKind::LayerForward, L + 1, layer_cost(L + 1, B));
    dev_.layernorm_forward(wr(lnf_), lnf_mean_.f32(), lnf_rstd_.f32(), rd(x, R * C), pw(w(lnf_w_)), pw(w(lnf_b_)), R, C);
    // Under sequence parallelism every rank's positions are gathered first: the logits are whole.
    const void* a = sp() ? seq_gather(lnf_full_.raw(), lnf_.raw(), C, L + 1) : lnf_.raw();
    dev_.linear_forward(out16(logits_), cast16(a, BT * C), cw(w(head_)), nullptr, BT, C, V);  // lm_head, tied
    if (half()) dev_.widen_half(logits32_.f32(), logits_.u16(), BT * V, hf_);  // output.float(): the loss in float32
  }
  if (hooks) hooks->after_forward(L + 1);
  drop_scratch();
  return half() ? logits32_.f32() : logits_.f32();
}

const void* GptCore::backward(std::vector<Parameter>& p, const void* dlogits, const Model::GradReadyHook& ready,
                              ComputeObserver* obs, LayerGate* gate, LayerHooks* hooks) {
  return run_backward(p, dlogits, ready, obs, gate, hooks, false);
}

const void* GptCore::backward_input(std::vector<Parameter>& p, const void* dlogits, const Model::GradReadyHook& ready,
                                    ComputeObserver* obs, LayerGate* gate, LayerHooks* hooks) {
  return run_backward(p, dlogits, ready, obs, gate, hooks, true);
}

const void* GptCore::run_backward(std::vector<Parameter>& p, const void* dlogits_in, const Model::GradReadyHook& ready,
                                  ComputeObserver* obs, LayerGate* gate, LayerHooks* hooks, bool input_only) {
  using P = GptParamIndex;
  DTLAB_CHECK(idx_ != nullptr || x_ != nullptr, "backward() called before forward()");
  const int64_t B = B_, T = s_.ctx, C = s_.embd, BT = B * seq_rows(), V = s_.vocab, R = residual_rows(B), Ct = C / tp_.degree;
  const int64_t Tl = R / B, t0 = sp() ? tp_.rank * Tl : 0;
  const int L = static_cast<int>(s_.layers);
  auto w = [&](int i) -> const Parameter& { return p[static_cast<size_t>(i)]; };
  auto g = [&](int i) { return &p[static_cast<size_t>(i)]; };
  // A Linear's weight and bias gradients: left to backward_weight() (W) when this is ZB's I.
  auto lg = [&](int i) { return input_only ? nullptr : &p[static_cast<size_t>(i)]; };
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
  auto keep = [&](Tensor& slot, const void* d, int64_t n) {
    if (!input_only) return;
    slot = Tensor({n}, MemCategory::Activations, tracker_, adt_, dev_);
    dev_.copy(slot.raw(), d, n * esz());
  };
  if (input_only) {
    douts_.clear();
    douts_.resize(static_cast<size_t>(r_.end_block(s_) - r_.first_block()));
  }
  // The head's float32 dlogits, rounded to 16 bits (the backward of output.float()); a stage
  // without the head receives its output's gradient in the layers' dtype.
  const void* dlogits = dlogits_in;
  if (half() && r_.heads(s_)) {
    dev_.narrow_half(dlogits16_.u16(), static_cast<const float*>(dlogits_in), BT * V, hf_);
    dlogits = dlogits16_.raw();
  } else if (amp_ && r_.heads(s_)) {  // autocast: the loss's float32 gradient reaching the 16-bit logits
    dev_.copy(dlogits16_.raw(), dlogits_in, BT * V * kF32);
    dev_.round_half(dlogits16_.f32(), BT * V, amp_hf_);
    dlogits = dlogits16_.raw();
  }
  void* dres = dres_.raw();
  void* dbuf = dbuf_.raw();
  const int fb = r_.first_block();
  const void* input = r_.embeds() ? encoded_.raw() : x_;  // the first block's input
  if (r_.heads(s_)) {
    const void* last = res3_.back().raw();
    enter(L + 1);
    {
      ComputeScope scope(obs, ComputeKind::LayerBackward, L + 1, 2 * layer_cost(L + 1, B));
      if (!sp()) {
        dev_.linear_backward(out16(dbuf, BT * C), cg(lg(head_)), nullptr, rd(dlogits, BT * V), cast16(lnf_), cw(w(head_)), BT, C, V);
        if (!frozen()) keep(dlogits_kept_, dlogits, BT * V);  // (a frozen head has no W)
      } else {  // this rank's positions only: the gather's backward is a split, the weight's gradient partial
        void* dl = dlogits_local_.raw();
        seq_rows(dl, dlogits, V, esz());
        void* part = frozen() ? nullptr : wte_part_.raw();
        if (part) dev_.fill_zero(part, V * C * esz());
        dev_.linear_backward(out16(dbuf, R * C), cacc(part, V * C), nullptr, rd(dl, R * V), cast16(lnf_), cw(w(head_)), R, C, V);
        if (part && !r_.embeds()) {  // a last stage's own copy: complete now
          add_group_sum(part, L + 1, {{g(head_), V * C}});
        }
      }
      dev_.fill_zero(dres, R * C * esz());
      ln_backward(p, dres, lnf_w_, lnf_b_, dbuf, last, lnf_mean_.f32(), lnf_rstd_.f32(), L + 1);
      // A last stage's own copy of the tied weight is complete here (the embedding group sums it with
      // the first stage's); the whole model's waits for the embedding's use below.
      if (r_.embeds() || (input_only && !sp())) done({lnf_b_, lnf_w_});
      else done({lnf_b_, lnf_w_, head_});
    }
    if (hooks) hooks->after_backward(L + 1);
  } else {
    dev_.copy(dres, dlogits, R * C * esz());  // the next stage's gradient of this stage's output
  }
  for (int l = r_.end_block(s_) - 1; l >= fb; l--) {
    const size_t u = local(l), k = slot(l);
    const void* block_in = l > fb ? res3_[u - 1].raw() : input;
    if (checkpointing_) {  // the block's forward again, from its kept input, before its backward needs it
      if (hooks) hooks->before_recompute(1 + l);
      {
        ComputeScope scope(obs, ComputeKind::Recompute, 1 + l, layer_cost(1 + l, B));
        recomputing_ = true;
        block_forward(p, l, block_in);
        recomputing_ = false;
      }
      if (hooks) hooks->after_recompute(1 + l);
    }
    enter(1 + l);
    std::optional<ComputeScope> scope(std::in_place, obs, ComputeKind::LayerBackward, 1 + l, 2 * layer_cost(1 + l, B));
    const int layer = 1 + l;
    // A row-parallel Linear's bias under sequence parallelism saw this rank's positions: its gradient
    // is summed over the group (without, the whole output gradient gives every rank the whole sum).
    // Under autocast without SP, RowParallelLinear's bias add (output_ + bias) is float32: its
    // gradient is the float32 row sum of the residual's gradient, not the 16-bit matmul's.
    auto row_bias_grad = [&](int bi) {
      const Parameter& q = p[static_cast<size_t>(bi)];
      if (half() ? !q.grad16 : !q.grad) return;  // frozen
      if (!sp()) {
        dev_.sum_rows(pg(&q), rd(dres, R * C), R, C);
        return;
      }
      void* part = part_.raw();
      dev_.fill_zero(part, C * esz());
      dev_.sum_rows(acc(part, C), rd(dres, R * C), R, C);
      add_group_sum(part, layer, {{&q, C}});
    };
    // The gradient reaching a 16-bit output (c_proj's) from the float32 residual stream: under
    // autocast rounded (the add's backward casts it to the output's dtype), then gathered in 16 bits.
    auto out_grad = [&]() -> const void* {
      const void* d = dres;
      if (amp_) {
        dev_.copy(dy16_.raw(), dres, R * C * kF32);
        dev_.round_half(dy16_.f32(), R * C, amp_hf_);
        d = dy16_.raw();
      }
      return sp() ? seq_gather(dfull_.raw(), d, C, layer, true) : d;  // g's backward
    };
    void* dfch = dfch_.raw();
    std::array<Tensor, 4>* kept = input_only ? &douts_[u] : nullptr;  // mlp.c_proj, c_fc, attn.c_proj, c_attn
    const void* dy = nullptr;
    const void* a = nullptr;
    const void* dln = nullptr;
    if (moe_block(l)) {  // (ZB's I computes the experts' and the router's gradients too: W is left the attention)
      a = ln2_[k].raw();  // (sequence parallel: this rank's positions, as in the forward)
      moe_backward(p, l, a, dres, [&](int i) { done({i}); });
      dln = dbuf;
    } else {
      dy = out_grad();
      dev_.linear_backward(out16(dfch, BT * 4 * Ct), cg(lg(pi(l, P::FcProjW))), cg(row_bias_apart() ? nullptr : lg(pi(l, P::FcProjB))), rd(dy, BT * C),
                           rd(fch_gelu_[k].raw(), BT * 4 * Ct), cw(w(pi(l, P::FcProjW))), BT, 4 * Ct, C);
      if (kept && !frozen()) keep((*kept)[0], dy, BT * C);  // (under LoRA W needs c_attn's alone)
      if (row_bias_apart()) row_bias_grad(pi(l, P::FcProjB));
      linear_done({pi(l, P::FcProjB), pi(l, P::FcProjW)});
      dev_.gelu_backward(out16(dfch, BT * 4 * Ct), rd(dfch, BT * 4 * Ct), rd(fch_[k].raw(), BT * 4 * Ct), BT * 4 * Ct);  // (elementwise: reads its own copy)
      if (kept && !frozen()) keep((*kept)[1], dfch, BT * 4 * Ct);
      a = sp() ? seq_gather(full_.raw(), ln2_[k].raw(), C, layer) : ln2_[k].raw();  // gathered again
      dev_.linear_backward(out16(dbuf, BT * C), cg(lg(pi(l, P::FcW))), cg(lg(pi(l, P::FcB))), rd(dfch, BT * 4 * Ct), cast16(a, BT * C),
                           cw(w(pi(l, P::FcW))), BT, C, 4 * Ct);
      dln = column_input_grad(dbuf, layer);  // f's backward
      linear_done({pi(l, P::FcB), pi(l, P::FcW)});
    }
    ln_backward(p, dres, pi(l, P::Ln2W), pi(l, P::Ln2B), dln, res2_[k].raw(), ln2_mean_[k].f32(), ln2_rstd_[k].f32(), layer);
    done({pi(l, P::Ln2B), pi(l, P::Ln2W)});
    dy = out_grad();
    dev_.linear_backward(out16(dbuf, BT * Ct), cg(lg(pi(l, P::AttnProjW))), cg(row_bias_apart() ? nullptr : lg(pi(l, P::AttnProjB))), rd(dy, BT * C),
                         rd(atty_[k]), cw(w(pi(l, P::AttnProjW))), BT, Ct, C);
    if (kept && !frozen()) keep((*kept)[2], dy, BT * C);
    if (row_bias_apart()) row_bias_grad(pi(l, P::AttnProjB));
    linear_done({pi(l, P::AttnProjB), pi(l, P::AttnProjW)});
    if (s_.cp.ring()) ring_attention_backward(k, l, dbuf);
    else if (cp()) ulysses_backward(k, l, dbuf);
    else dev_.attention_backward(out16(dqkv_), datt_.f32(), rd(dbuf, BT * Ct), rd(qkv_[k]), rd(att_[k]), B, T, Ct, s_.heads / tp_.degree,
                                 round16());
    if (kept && (!frozen() || adapter(l) >= 0)) keep((*kept)[3], dqkv_.raw(), BT * 3 * Ct);
    a = sp() ? seq_gather(full_.raw(), ln1_[k].raw(), C, layer) : ln1_[k].raw();
    dev_.linear_backward(out16(dbuf, BT * C), cg(lg(pi(l, P::AttnW))), cg(lg(pi(l, P::AttnB))), rd(dqkv_), cast16(a, BT * C),
                         cw(w(pi(l, P::AttnW))), BT, C, 3 * Ct);
    if (adapter(l) >= 0) {  // peft's lora_B then lora_A; their input gradient joins c_attn's before f sums it
      lora_backward(l, dbuf, dqkv_.raw(), a, !input_only, layer);
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
  if (!r_.embeds()) {
    drop_scratch();
    return dres;  // the gradient of the stage's input, for the previous stage
  }
  enter(0);
  if (!frozen()) {  // (a frozen LoRA base: nothing to compute for the embeddings)
    ComputeScope scope(obs, ComputeKind::LayerBackward, 0, 2 * layer_cost(0, B));
    // Under sequence parallelism this rank's positions give partial sums (wte's already holds the
    // head's), summed over the group before they are added.
    if (cp() && !sp()) {
      F32 dwte = pg(g(P::kWte)), dwpe = pg(g(P::kWpe));
      F32 dx = rd(dres, R * C);
      position_runs([&](int64_t b, int64_t row, int64_t n, int64_t pos) {
        dev_.embedding_backward(dwte, dwpe, static_cast<const float*>(dx) + row * C, idx_ + b * T, n, n, T, pos, C);
      });
    } else if (!sp()) {
      dev_.embedding_backward(pg(g(P::kWte)), pg(g(P::kWpe)), rd(dres, R * C), idx_, R, Tl, T, t0, C);
    } else {
      void* dwte = wte_part_.raw();
      void* dwpe = part_.raw();
      dev_.fill_zero(dwpe, T * C * esz());
      if (!r_.heads(s_)) dev_.fill_zero(dwte, V * C * esz());  // a first stage: no head's share
      if (!cp()) {
        dev_.embedding_backward(acc(dwte, V * C), acc(dwpe, T * C), rd(dres, R * C), idx_, R, Tl, T, t0, C);
      } else {
        F32 dw = acc(dwte, V * C), dp = acc(dwpe, T * C);
        F32 dx = rd(dres, R * C);
        position_runs([&](int64_t b, int64_t row, int64_t n, int64_t pos) {
          dev_.embedding_backward(dw, dp, static_cast<const float*>(dx) + row * C, idx_ + b * T, n, n, T, pos, C);
        });
      }
      add_group_sum(dwpe, 0, {{g(P::kWpe), T * C}});
      add_group_sum(dwte, 0, {{g(P::kWte), V * C}});
    }
    if (input_only && r_.heads(s_) && !sp()) done({P::kWpe});  // wte waits for the head's share, in W
    else done({P::kWpe, P::kWte});
  }
  if (hooks) hooks->after_backward(0);
  drop_scratch();
  return nullptr;
}

void GptCore::backward_weight(std::vector<Parameter>& p, const Model::GradReadyHook& ready, ComputeObserver* obs, LayerGate* gate,
                              LayerHooks* hooks) {
  using P = GptParamIndex;
  const int64_t B = B_, T = seq_rows(), C = s_.embd, BT = B * T, V = s_.vocab, Ct = C / tp_.degree;
  const int L = static_cast<int>(s_.layers);
  DTLAB_CHECK(douts_.size() == static_cast<size_t>(r_.end_block(s_) - r_.first_block()), "W ran before its I; the schedule is wrong");
  auto w = [&](int i) -> const Parameter& { return p[static_cast<size_t>(i)]; };
  auto g = [&](int i) { return &p[static_cast<size_t>(i)]; };
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
      ComputeScope scope(obs, ComputeKind::LayerBackward, L + 1, layer_cost(L + 1, B));
      dev_.linear_backward(nullptr, cg(g(head_)), nullptr, rd(dlogits_kept_), cast16(lnf_), cw(w(head_)), BT, C, V);
      if (!r_.embeds()) done({head_});
    }
    if (hooks) hooks->after_backward(L + 1);
  }
  const int fb = r_.first_block();
  const void* input = r_.embeds() ? encoded_.raw() : x_;
  for (int l = r_.end_block(s_) - 1; l >= fb; l--) {
    const size_t u = local(l), k = slot(l);
    const bool work = base || adapter(l) >= 0;
    if (checkpointing_ && work) {  // the block's inputs again: its forward once more, from its kept input
      if (hooks) hooks->before_recompute(1 + l);
      ComputeScope scope(obs, ComputeKind::Recompute, 1 + l, layer_cost(1 + l, B));
      recomputing_ = true;
      block_forward(p, l, l > fb ? res3_[u - 1].raw() : input);
      recomputing_ = false;
    }
    if (checkpointing_ && work && hooks) hooks->after_recompute(1 + l);
    enter(1 + l);
    ComputeScope scope(obs, ComputeKind::LayerBackward, 1 + l, layer_cost(1 + l, B));
    std::array<Tensor, 4>& d = douts_[u];
    const int layer = 1 + l;
    // Under sequence parallelism (and under autocast with TP) the row layers' biases were summed in I, and the column layers read
    // their LayerNorm's output gathered once more.
    if (base && !moe_block(l)) {  // (an MoE block's MLP gradients came in I)
      dev_.linear_backward(nullptr, cg(g(pi(l, P::FcProjW))), cg(row_bias_apart() ? nullptr : g(pi(l, P::FcProjB))), rd(d[0]),
                           rd(fch_gelu_[k].raw(), BT * 4 * Ct), cw(w(pi(l, P::FcProjW))), BT, 4 * Ct, C);
      done({pi(l, P::FcProjB), pi(l, P::FcProjW)});
      const void* a = sp() ? seq_gather(full_.raw(), ln2_[k].raw(), C, layer) : ln2_[k].raw();
      dev_.linear_backward(nullptr, cg(g(pi(l, P::FcW))), cg(g(pi(l, P::FcB))), rd(d[1]), cast16(a, BT * C), cw(w(pi(l, P::FcW))), BT, C,
                           4 * Ct);
      done({pi(l, P::FcB), pi(l, P::FcW)});
    }
    if (base) {
      dev_.linear_backward(nullptr, cg(g(pi(l, P::AttnProjW))), cg(row_bias_apart() ? nullptr : g(pi(l, P::AttnProjB))), rd(d[2]), rd(atty_[k]),
                           cw(w(pi(l, P::AttnProjW))), BT, Ct, C);
      done({pi(l, P::AttnProjB), pi(l, P::AttnProjW)});
    }
    const void* a = work ? (sp() ? seq_gather(full_.raw(), ln1_[k].raw(), C, layer) : ln1_[k].raw()) : nullptr;
    if (base) {
      dev_.linear_backward(nullptr, cg(g(pi(l, P::AttnW))), cg(g(pi(l, P::AttnB))), rd(d[3]), cast16(a, BT * C), cw(w(pi(l, P::AttnW))), BT,
                           C, 3 * Ct);
      done({pi(l, P::AttnB), pi(l, P::AttnW)});
    }
    if (adapter(l) >= 0) {
      lora_backward(l, nullptr, d[3].raw(), a, true, layer);
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
  drop_scratch();
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
