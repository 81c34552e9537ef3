// Context parallelism in the GPT's attention (GptCore; docs/strategies.md, "Context parallelism";
// sources in docs/course_sources.md §6h): ring attention over the CP group's K/V blocks with the
// online softmax (contiguous and zigzag layouts), and DeepSpeed-Ulysses' all-to-alls around whole
// attention. Ring attention's online softmax runs in host loops (on a GPU over host copies, GptCore::Host);
// Ulysses' regrouping and attention are the device's copies and kernels.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "engine/core/check.h"
#include "engine/core/gpt.h"

namespace dtlab {

int64_t GptCore::CpPass::blocks() const {
  return std::count_if(pairs.begin(), pairs.end(), [](int64_t p) { return p > 0; });
}

int64_t GptCore::CpPass::total_pairs() const {
  int64_t n = 0;
  for (int64_t p : pairs) n += p;
  return n;
}

const GptCore::CpPass* GptCore::cp_pass(int l) const {
  if (!s_.cp.ring() || l < r_.first_block() || l >= r_.end_block(s_) || local(l) >= cp_passes_.size()) return nullptr;
  const CpPass& p = cp_passes_[local(l)];
  return p.held.empty() ? nullptr : &p;
}

const GptCore::CpPass* GptCore::cp_pass(int l, bool backward) const {
  const CpPass* p = cp_pass(l);
  if (!p || p->backward == backward) return p;
  const CpPass& prev = cp_prev_passes_[local(l)];
  return prev.held.empty() || prev.backward != backward ? nullptr : &prev;
}

int64_t GptCore::causal_pairs(const std::vector<int64_t>& qpos, const std::vector<int64_t>& kpos) {
  int64_t n = 0;
  for (int64_t q : qpos)
    for (int64_t k : kpos) n += k <= q;
  return n;
}

namespace {

// Ring attention's per-block work on float32 host memory. q: (B, Tq, ld_q) with head h's query at
// columns h hs; kv: (B, Tq, 2 Ct), K then V. qpos/kpos: the global positions of the query and key
// rows (the causal mask: key position <= query position).
struct RingBlock {
  int64_t B, Tq, H, hs, Ct, ld_q;
  float scale;
  const std::vector<int64_t>& qpos;
  const std::vector<int64_t>& kpos;
  int64_t q_at(int64_t b, int64_t i, int64_t h) const { return (b * Tq + i) * ld_q + h * hs; }
  int64_t k_at(int64_t b, int64_t j, int64_t h) const { return (b * Tq + j) * 2 * Ct + h * hs; }
  int64_t v_at(int64_t b, int64_t j, int64_t h) const { return k_at(b, j, h) + Ct; }
  int64_t o_at(int64_t b, int64_t i, int64_t h) const { return (b * Tq + i) * Ct + h * hs; }
  int64_t s_at(int64_t b, int64_t h, int64_t i) const { return (b * H + h) * Tq + i; }
};

// The online softmax's merge of one K/V block into the running max m, sum l (double, as the whole
// softmax sums in double) and unnormalised output o.
void ring_block_forward(const RingBlock& g, const float* q, const float* kv, float* o, float* m, double* l) {
  std::vector<float> sc(static_cast<size_t>(g.Tq));
  for (int64_t b = 0; b < g.B; b++)
    for (int64_t h = 0; h < g.H; h++)
      for (int64_t i = 0; i < g.Tq; i++) {
        const float* qi = q + g.q_at(b, i, h);
        float bm = -std::numeric_limits<float>::infinity();
        bool any = false;
        for (int64_t j = 0; j < g.Tq; j++) {
          if (g.kpos[static_cast<size_t>(j)] > g.qpos[static_cast<size_t>(i)]) continue;
          const float* kj = kv + g.k_at(b, j, h);
          float dot = 0;
          for (int64_t d = 0; d < g.hs; d++) dot += qi[d] * kj[d];
          sc[static_cast<size_t>(j)] = dot * g.scale;
          bm = std::max(bm, sc[static_cast<size_t>(j)]);
          any = true;
        }
        if (!any) continue;
        const int64_t si = g.s_at(b, h, i);
        const float mnew = std::max(m[si], bm);
        const float corr = std::exp(m[si] - mnew);  // 0 for the first block (m = -inf)
        float* oi = o + g.o_at(b, i, h);
        double sum = l[si] * corr;
        for (int64_t d = 0; d < g.hs; d++) oi[d] *= corr;
        for (int64_t j = 0; j < g.Tq; j++) {
          if (g.kpos[static_cast<size_t>(j)] > g.qpos[static_cast<size_t>(i)]) continue;
          const float p = std::exp(sc[static_cast<size_t>(j)] - mnew);
          sum += p;
          const float* vj = kv + g.v_at(b, j, h);
          for (int64_t d = 0; d < g.hs; d++) oi[d] += p * vj[d];
        }
        m[si] = mnew;
        l[si] = sum;
      }
}

// One K/V block's share of the backward: with P = exp(scale q k - lse), dV += P^T dO,
// dS = P (dO V^T - rowsum(dO O)), dQ += scale dS K, dK += scale dS^T Q. dkv: (B, Tq, 2 Ct) as kv.
void ring_block_backward(const RingBlock& g, const float* q, const float* kv, const float* dout, const float* lse,
                         const float* delta, float* dq, float* dkv) {
  for (int64_t b = 0; b < g.B; b++)
    for (int64_t h = 0; h < g.H; h++)
      for (int64_t i = 0; i < g.Tq; i++) {
        const float* qi = q + g.q_at(b, i, h);
        const float* doi = dout + g.o_at(b, i, h);
        float* dqi = dq + g.o_at(b, i, h);
        const int64_t si = g.s_at(b, h, i);
        for (int64_t j = 0; j < g.Tq; j++) {
          if (g.kpos[static_cast<size_t>(j)] > g.qpos[static_cast<size_t>(i)]) continue;
          const float* kj = kv + g.k_at(b, j, h);
          const float* vj = kv + g.v_at(b, j, h);
          float dot = 0, dp = 0;
          for (int64_t d = 0; d < g.hs; d++) {
            dot += qi[d] * kj[d];
            dp += doi[d] * vj[d];
          }
          const float p = std::exp(dot * g.scale - lse[si]);
          const float ds = p * (dp - delta[si]) * g.scale;
          float* dkj = dkv + g.k_at(b, j, h);
          float* dvj = dkv + g.v_at(b, j, h);
          for (int64_t d = 0; d < g.hs; d++) {
            dvj[d] += p * doi[d];
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
          }
        }
      }
}

}  // namespace

GptCore::CpPass GptCore::start_ring(size_t k, bool backward) {
  // The rank's own K and V (columns [Ct, 3Ct) of each qkv row) start the ring.
  const int64_t rows = B_ * seq_rows(), Ct = s_.embd / tp_.degree;
  for (int64_t row = 0; row < rows; row++) dev_.copy(at(cp_a_.raw(), row * 2 * Ct), at(qkv_[k].raw(), row * 3 * Ct + Ct), 2 * Ct * esz());
  CpPass pass;
  pass.backward = backward;
  pass.held.assign(static_cast<size_t>(s_.cp.degree), -1);
  pass.pairs.assign(pass.held.size(), 0);
  pass.sent_bytes.assign(pass.held.size(), 0);
  return pass;
}

void GptCore::ring_attention_forward(size_t k, int l) {
  DTLAB_CHECK(cp_comm_ != nullptr, "a context-parallel GPT runs only after set_cp_comm()");
  const int64_t B = B_, Tq = seq_rows(), Ct = s_.embd / tp_.degree, H = s_.heads / tp_.degree, hs = Ct / H;
  const int64_t c = s_.cp.degree, me = s_.cp.rank, n = B * Tq * 2 * Ct;
  const int next = static_cast<int>((me + 1) % c), prev = static_cast<int>((me + c - 1) % c);
  std::vector<float> o(static_cast<size_t>(B * Tq * Ct), 0.0f), m(static_cast<size_t>(B * H * Tq), -std::numeric_limits<float>::infinity());
  std::vector<double> sum(m.size(), 0.0);
  cp_prev_passes_[local(l)] = std::move(cp_passes_[local(l)]);
  CpPass& pass = cp_passes_[local(l)];
  pass = start_ring(k, false);
  cp_block_ = l;
  const std::vector<int64_t>& qpos = cp_pos_[static_cast<size_t>(me)];
  void* cur = cp_a_.raw();
  void* nxt = cp_b_.raw();
  {
    F32 q32 = rd(qkv_[k]);
    Host q(dev_, q32, B * Tq * 3 * Ct, true, false);
    for (int64_t s = 0; s < c; s++) {
      const int64_t j = (me - s + c) % c;  // whose block this rank holds at step s
      const std::vector<int64_t>& kpos = cp_pos_[static_cast<size_t>(j)];
      const int64_t pairs = causal_pairs(qpos, kpos);
      if (pairs > 0) {
        F32 kv32 = rd(cur, n);
        Host kv(dev_, kv32, n, true, false);
        ring_block_forward({B, Tq, H, hs, Ct, 3 * Ct, 1.0f / std::sqrt(static_cast<float>(hs)), qpos, kpos}, q, kv, o.data(), m.data(), sum.data());
      }
      pass.held[static_cast<size_t>(s)] = static_cast<int>(j);
      pass.pairs[static_cast<size_t>(s)] = pairs;
      pass.steps_done = static_cast<int>(s) + 1;
      if (s + 1 < c) {  // pass the block on; receive the one before it
        pass.sent_bytes[static_cast<size_t>(s)] = n * wire_esz();
        pass.sending = true;
        wire16(nxt, n, cur, n, [&](void* d, const void* src, DType dt) { cp_comm_->send_recv(d, prev, src, next, n, dt, 1 + l); });
        pass.sending = false;
        std::swap(cur, nxt);
      }
    }
  }
  // o / l, and the log-sum-exp the backward rebuilds the probabilities from.
  F32 y32 = out16(atty_[k]);
  Host y(dev_, y32, B * Tq * Ct, false, true), lse(dev_, cp_lse_[k].f32(), B * H * Tq, false, true);
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < Tq; i++) {
        const int64_t si = (b * H + h) * Tq + i, oi = (b * Tq + i) * Ct + h * hs;
        const float inv = static_cast<float>(1.0 / sum[static_cast<size_t>(si)]);
        for (int64_t d = 0; d < hs; d++) static_cast<float*>(y)[oi + d] = o[static_cast<size_t>(oi + d)] * inv;
        lse[si] = m[static_cast<size_t>(si)] + static_cast<float>(std::log(sum[static_cast<size_t>(si)]));
      }
}

void GptCore::ring_attention_backward(size_t k, int l, const void* dy) {
  const int64_t B = B_, Tq = seq_rows(), Ct = s_.embd / tp_.degree, H = s_.heads / tp_.degree, hs = Ct / H;
  const int64_t c = s_.cp.degree, me = s_.cp.rank, n = B * Tq * 2 * Ct;
  // The other way round: blocks go to rank r - 1, and come from r + 1.
  const int next = static_cast<int>((me + 1) % c), prev = static_cast<int>((me + c - 1) % c);
  std::vector<float> dq(static_cast<size_t>(B * Tq * Ct), 0.0f), dkv(static_cast<size_t>(n), 0.0f), own(dkv.size(), 0.0f);
  std::vector<float> delta(static_cast<size_t>(B * H * Tq), 0.0f);
  CpPass pass = start_ring(k, true);
  cp_prev_passes_[local(l)] = cp_passes_[local(l)];
  cp_block_ = l;
  const std::vector<int64_t>& qpos = cp_pos_[static_cast<size_t>(me)];
  void* cur = cp_a_.raw();
  void* nxt = cp_b_.raw();
  void* dsend = cp_c_.raw();
  void* drecv = cp_d_.raw();
  {
    F32 q32 = rd(qkv_[k]);
    F32 dout32 = rd(dy, B * Tq * Ct);
    Host q(dev_, q32, B * Tq * 3 * Ct, true, false), dout(dev_, dout32, B * Tq * Ct, true, false);
    Host lse(dev_, cp_lse_[k].f32(), B * H * Tq, true, false);
    {
      F32 y32 = rd(atty_[k]);
      Host y(dev_, y32, B * Tq * Ct, true, false);
      for (int64_t b = 0; b < B; b++)  // rowsum(dO O) per query and head
        for (int64_t h = 0; h < H; h++)
          for (int64_t i = 0; i < Tq; i++) {
            const int64_t oi = (b * Tq + i) * Ct + h * hs;
            float d = 0;
            for (int64_t e = 0; e < hs; e++) d += static_cast<const float*>(dout)[oi + e] * static_cast<const float*>(y)[oi + e];
            delta[static_cast<size_t>((b * H + h) * Tq + i)] = d;
          }
    }
    for (int64_t s = 0; s < c; s++) {
      const int64_t j = (me + s) % c;
      const std::vector<int64_t>& kpos = cp_pos_[static_cast<size_t>(j)];
      const int64_t pairs = causal_pairs(qpos, kpos);
      // Step 0 is the rank's own block: its share stays here. The others' shares of a block pass from
      // rank to rank one step behind it, each adding its own, and the last reaches the owner.
      std::vector<float>& into = s == 0 ? own : dkv;
      if (pairs > 0) {
        F32 kv32 = rd(cur, n);
        Host kv(dev_, kv32, n, true, false);
        ring_block_backward({B, Tq, H, hs, Ct, 3 * Ct, 1.0f / std::sqrt(static_cast<float>(hs)), qpos, kpos}, q, kv, dout,
                            lse, delta.data(), dq.data(), into.data());
      }
      pass.held[static_cast<size_t>(s)] = static_cast<int>(j);
      pass.pairs[static_cast<size_t>(s)] = pairs;
      pass.steps_done = static_cast<int>(s) + 1;
      if (s + 1 < c) pass.sent_bytes[static_cast<size_t>(s)] += n * wire_esz();
      if (s > 0) pass.sent_bytes[static_cast<size_t>(s)] += n * wire_esz();
      pass.sending = true;
      cp_passes_[local(l)] = pass;
      if (s + 1 < c) {  // the block on to rank r - 1
        wire16(nxt, n, cur, n, [&](void* d, const void* src, DType dt) { cp_comm_->send_recv(d, next, src, prev, n, dt, 1 + l); });
        std::swap(cur, nxt);
      }
      if (s > 0) {  // its dK/dV so far after it; from rank r + 1, the shares of the block held next (last: of this rank's)
        if (half()) upload_half(dev_, static_cast<uint16_t*>(dsend), dkv.data(), n, hf_);
        else dev_.upload(dsend, dkv.data(), n * static_cast<int64_t>(sizeof(float)));
        // (Autocast: dK and dV travel in 16 bits, rounded at each hop, as in --precision.)
        wire16(drecv, n, dsend, n, [&](void* d, const void* src, DType dt) { cp_comm_->send_recv(d, next, src, prev, n, dt, 1 + l); });
        if (half()) download_half(dev_, dkv.data(), static_cast<const uint16_t*>(drecv), n, hf_);
        else dev_.download(dkv.data(), drecv, n * static_cast<int64_t>(sizeof(float)));
      }
      pass.sending = false;
      cp_passes_[local(l)] = pass;
    }
  }
  for (size_t i = 0; i < dkv.size(); i++) dkv[i] += own[i];
  // dkv: this rank's own block's dK and dV, every rank's queries summed in; dq: its queries'.
  F32 d = out16(dqkv_);
  Host out(dev_, d, B * Tq * 3 * Ct, false, true);
  for (int64_t row = 0; row < B * Tq; row++) {
    std::copy_n(dq.data() + row * Ct, Ct, out + row * 3 * Ct);
    std::copy_n(dkv.data() + row * 2 * Ct, 2 * Ct, out + row * 3 * Ct + Ct);
  }
}

void GptCore::ulysses_forward(size_t k, int l) {
  DTLAB_CHECK(cp_comm_ != nullptr, "a context-parallel GPT runs only after set_cp_comm()");
  const int64_t B = B_, Tq = seq_rows(), T = s_.ctx, Ct = s_.embd / tp_.degree, H = s_.heads / tp_.degree, c = s_.cp.degree;
  const int64_t Cu = Ct / c, Hu = H / c, e = esz();
  // To rank j: its heads' q, k and v of this rank's positions, (B, T/c, 3, C/tc).
  for (int64_t j = 0; j < c; j++)
    for (int64_t row = 0; row < B * Tq; row++)
      for (int64_t part = 0; part < 3; part++)
        dev_.copy(at(cp_a_.raw(), ((j * B * Tq + row) * 3 + part) * Cu), at(qkv_[k].raw(), row * 3 * Ct + part * Ct + j * Cu), Cu * e);
  const auto a2a = [&](int64_t per_rank) {  // cp_a_ to cp_b_, per_rank elements to each rank (16-bit under autocast)
    wire16(cp_b_.raw(), c * per_rank, cp_a_.raw(), c * per_rank,
           [&](void* d, const void* src, DType dt) { cp_comm_->all_to_all(d, src, per_rank, dt, 1 + l); });
  };
  a2a(B * Tq * 3 * Cu);
  // From rank i: its positions of this rank's heads; in position order, (B, T, 3 C/tc).
  void* full = cp_qkv_[k].raw();
  for (int64_t i = 0; i < c; i++)
    for (int64_t b = 0; b < B; b++)
      dev_.copy(at(full, (b * T + i * Tq) * 3 * Cu), at(cp_b_.raw(), (i * B + b) * Tq * 3 * Cu), Tq * 3 * Cu * e);
  dev_.attention_forward(out16(cp_y_), out16(att_[k]), rd(cp_qkv_[k]), B, T, Cu, Hu, round16());
  // Back to the sequence split: rank j's positions of this rank's heads' output.
  for (int64_t j = 0; j < c; j++)
    for (int64_t b = 0; b < B; b++)
      dev_.copy(at(cp_a_.raw(), (j * B + b) * Tq * Cu), at(cp_y_.raw(), (b * T + j * Tq) * Cu), Tq * Cu * e);
  a2a(B * Tq * Cu);
  for (int64_t i = 0; i < c; i++)
    for (int64_t row = 0; row < B * Tq; row++)
      dev_.copy(at(atty_[k].raw(), row * Ct + i * Cu), at(cp_b_.raw(), (i * B * Tq + row) * Cu), Cu * e);
}

void GptCore::ulysses_backward(size_t k, int l, const void* dy) {
  const int64_t B = B_, Tq = seq_rows(), T = s_.ctx, Ct = s_.embd / tp_.degree, H = s_.heads / tp_.degree, c = s_.cp.degree;
  const int64_t Cu = Ct / c, Hu = H / c, e = esz();
  // The output gradient to the head split (the forward's second all-to-all, reversed).
  for (int64_t j = 0; j < c; j++)
    for (int64_t row = 0; row < B * Tq; row++)
      dev_.copy(at(cp_a_.raw(), (j * B * Tq + row) * Cu), at(dy, row * Ct + j * Cu), Cu * e);
  const auto a2a = [&](int64_t per_rank) {  // as ulysses_forward's
    wire16(cp_b_.raw(), c * per_rank, cp_a_.raw(), c * per_rank,
           [&](void* d, const void* src, DType dt) { cp_comm_->all_to_all(d, src, per_rank, dt, 1 + l); });
  };
  a2a(B * Tq * Cu);
  for (int64_t i = 0; i < c; i++)
    for (int64_t b = 0; b < B; b++)
      dev_.copy(at(cp_y_.raw(), (b * T + i * Tq) * Cu), at(cp_b_.raw(), (i * B + b) * Tq * Cu), Tq * Cu * e);
  // Whole attention's backward over the head split, into the gathered layout (cp_qkv_ is read, the
  // gradient goes to cp_a_'s room first: (B, T, 3 C/tc) is what one all-to-all's buffer holds).
  Tensor dfull({B * T * 3 * Cu}, MemCategory::Activations, tracker_, adt_, dev_);
  dev_.attention_backward(out16(dfull), datt_.f32(), rd(cp_y_), rd(cp_qkv_[k]), rd(att_[k]), B, T, Cu, Hu, round16());
  // Back to the sequence split: rank j's positions of dq, dk, dv for this rank's heads.
  for (int64_t j = 0; j < c; j++)
    for (int64_t b = 0; b < B; b++)
      dev_.copy(at(cp_a_.raw(), (j * B + b) * Tq * 3 * Cu), at(dfull.raw(), (b * T + j * Tq) * 3 * Cu), Tq * 3 * Cu * e);
  a2a(B * Tq * 3 * Cu);
  for (int64_t i = 0; i < c; i++)
    for (int64_t row = 0; row < B * Tq; row++)
      for (int64_t part = 0; part < 3; part++)
        dev_.copy(at(dqkv_.raw(), row * 3 * Ct + part * Ct + i * Cu), at(cp_b_.raw(), ((i * B * Tq + row) * 3 + part) * Cu), Cu * e);
}

}  // namespace dtlab
