// Mixed precision inside the model (--precision bf16/fp16; model.h's set_precision; sources in
// docs/course_sources.md §6e). The 16-bit tensors are the model's memory; a Linear widens its 16-bit
// operands to float32 scratch, runs the float32 kernels of the device (the GEMM accumulates in fp32,
// as tensor cores and torch's CPU bf16 GEMM do) and rounds each result once to 16 bits.
// On a tensor-parallel shard the pairs' collectives move those 16-bit tensors (Megatron under bf16:
// a row-parallel Linear's partial output is a bf16 tensor, all-reduced as bf16; docs/course_sources.md
// §6c: the bf16 bullet), so a partial sum is rounded before the group adds it: TP in 16 bits equals the one-rank 16-bit
// model within 16-bit rounding, not bit for bit (float32 TP does, within float32 rounding).
#include <algorithm>

#include "engine/core/check.h"
#include "engine/core/gpt.h"
#include "engine/core/model.h"

namespace dtlab {

DType Model::param_dtype() const {
  return precision_ == Precision::BF16 ? DType::BF16 : precision_ == Precision::FP16 ? DType::F16 : DType::F32;
}

DType Model::act_dtype() const {
  if (!half_acts()) return DType::F32;
  return half_format() == HalfFormat::BF16 ? DType::BF16 : DType::F16;
}

void Model::set_amp(Precision p) {
  if (!is_mixed(p)) return;
  if (mixed()) throw Error("--amp with --precision: autocast keeps float32 parameters, --precision makes them 16-bit; choose one");
  amp_ = p;
  if (gpt_) gpt_->set_amp(p);  // its layers' autocast (engine/core/gpt.h)
  acts_.clear();  // allocated again in 16 bits by the next forward
  for (auto& d : dbuf_) d = Tensor();
  capacity_ = 0;
}

void Model::set_precision(Precision p) {
  if (p == precision_) return;
  const std::string flag = std::string("--precision ") + precision_name(p);
  if (!is_mixed(p) || mixed()) throw Error("a model's precision is set once, from fp32");
  // (A LoRA pipeline stage whose layers carry no adapter trains nothing: only its frozen base turns 16-bit.)
  DTLAB_CHECK(owns_parameters() || num_params_ == 0, "set_precision() on a model whose parameters are sharded");
  // The model as built (torch's init), then .to(dtype).
  const std::vector<float> values = num_params_ > 0 ? host_params() : std::vector<float>();
  precision_ = p;
  if (num_params_ > 0) {
    flat_params_ = Tensor();  // freed before the 16-bit copies exist: the model never holds both
    flat_grads_ = Tensor();
    flat_params_ = Tensor({num_params_}, MemCategory::Parameters, tracker_, param_dtype(), device_);
    flat_grads_ = Tensor({num_params_}, MemCategory::Gradients, tracker_, param_dtype(), device_);
    upload_half(device_, flat_params_.u16(), values.data(), num_params_, half_format());
  }
  for (auto& q : params_) {
    q.data = q.grad = nullptr;
    q.data16 = flat_params_.u16() + q.offset;
    q.grad16 = flat_grads_.u16() + q.offset;
  }
  if (lora()) {  // the frozen base too: the 16-bit copy replaces the float32 one
    const int64_t n = frozen_.numel();
    std::vector<float> base(static_cast<size_t>(n));
    device_.download(base.data(), frozen_.f32(), n * static_cast<int64_t>(sizeof(float)));
    frozen_ = Tensor();
    frozen_ = Tensor({n}, MemCategory::Parameters, tracker_, param_dtype(), device_);
    upload_half(device_, frozen_.u16(), base.data(), n, half_format());
    for (auto& q : base_) {
      q.data = nullptr;
      q.data16 = frozen_.u16() + q.offset;
    }
  }
  if (gpt_) gpt_->set_precision(p);  // its saved tensors in 16 bits (engine/core/gpt.h)
  acts_.clear();  // allocated again in 16 bits by the next forward
  for (auto& d : dbuf_) d = Tensor();
  capacity_ = 0;
}

float* Model::f32_scratch(Tensor& t, int64_t n) {
  if (t.numel() < n) t = Tensor({n}, MemCategory::Other, tracker_, DType::F32, device_);
  return t.f32();
}

const float* Model::operand(Tensor& t, const Parameter& p, int64_t n) {
  if (!amp()) return widen(t, p.data16, n);
  float* dst = f32_scratch(t, n);
  device_.copy(dst, p.data, n * static_cast<int64_t>(sizeof(float)));
  device_.round_half(dst, n, half_format());  // autocast's weight.to(dtype)
  return dst;
}

float* Model::widen(Tensor& t, const uint16_t* src, int64_t n) {
  float* dst = f32_scratch(t, n);
  device_.widen_half(dst, src, n, half_format());
  return dst;
}

const float* Model::half_forward(const float* x, int64_t B) {
  ensure_activations(B);
  input_ = x;
  const int64_t D = spec_.dims[static_cast<size_t>(first_linear_)];
  if (x16_.numel() < B * D) x16_ = Tensor({B * D}, MemCategory::Activations, tracker_, act_dtype(), device_);
  device_.narrow_half(x16_.u16(), x, B * D, half_format());  // the batch as x.to(dtype)
  layer_in16_.assign(layers_.size(), nullptr);
  const bool sp = sequence_parallel();
  const uint16_t* in = x16_.u16();
  if (sp) {  // this rank's rows, as the float32 forward splits them
    uint16_t* mine = half_scratch(sp_x16_, padded_ / tp_.degree * D);
    half_sp_split_rows(mine, in, D);
    in = mine;
  }
  for (int i = 0; i < num_layers(); i++) {
    layer_in16_[static_cast<size_t>(i)] = in;
    if (layer_skipped(i)) continue;  // the branch: this block's output is its input
    gate_layer(i, false);
    if (hooks_) hooks_->before_forward(i);
    uint16_t* out = keeps_output(i) ? acts_[static_cast<size_t>(i)].u16() : recompute_.u16();
    half_layer_forward(i, out, in, B, ComputeKind::LayerForward);
    if (hooks_) hooks_->after_forward(i);
    in = out;
  }
  const Layer& last = layer(num_layers() - 1);
  const int64_t C = last.out_features;
  int64_t rows = B;
  if (sp) {  // every rank's rows of the logits (padded_ rows, as the float32 forward returns them)
    uint16_t* all = half_scratch(sp_logits16_, padded_ * C);
    tp_comm().all_gather(all, in, padded_ / tp_.degree * C, act_dtype(), last.seq_index);
    in = all;
    rows = padded_;
  }
  if (logits32_.numel() < rows * C) logits32_ = Tensor({rows * C}, MemCategory::Activations, tracker_, DType::F32, device_);
  device_.widen_half(logits32_.f32(), in, rows * C, half_format());  // the loss runs in float32
  return logits32_.f32();
}

void Model::half_layer_forward(int i, uint16_t* out, const uint16_t* in, int64_t B, ComputeKind kind) {
  if (sequence_parallel()) return half_sp_layer_forward(i, out, in, kind);
  const Layer& L = layer(i);
  const int64_t n_out = B * L.out_features;
  const bool row = L.kind == LayerKind::Linear && L.tp == TpRole::Row;
  const float* b = nullptr;
  {
    ComputeScope scope(observer_, kind, L.seq_index, layer_forward_cost(i, B));
    if (L.kind == LayerKind::ReLU) return half_relu_forward(out, in, n_out);
    const float* x = widen(fa_, in, B * L.in_features);
    const float* w = operand(fb_, weight_of(L), L.out_features * L.in_features);
    b = operand(fc_, bias_of(L), L.out_features);
    float* y = f32_scratch(fd_, n_out);
    device_.linear_forward(y, x, w, row ? nullptr : b, B, L.in_features, L.out_features);
    device_.narrow_half(out, y, n_out, half_format());
    if (L.lora_a >= 0) half_lora_forward(L, out, x, B);
  }
  if (!row) return;
  // g: the 16-bit partial outputs summed over the TP group, then the bias added once (model.cpp).
  tp_comm().all_reduce(out, n_out, act_dtype(), L.seq_index);
  half_add_bias_rows(out, b, B, L.out_features);
}

// out (rows, OC) + bias in every row, as torch adds two 16-bit tensors: widen, add, round once.
void Model::half_add_bias_rows(uint16_t* out, const float* bias, int64_t rows, int64_t OC) {
  float* y = widen(fh_, out, rows * OC);
  device_.add_rows(y, bias, rows, OC);
  device_.narrow_half(out, y, rows * OC, half_format());
}

// ReLU on 16-bit tensors: the float32 op on the widened values (clamp_min: NaN and -0.0 pass), whose
// results are 16-bit values already, so the narrowing is exact.
void Model::half_relu_forward(uint16_t* out, const uint16_t* in, int64_t n) {
  float* x = widen(fh_, in, n);
  device_.relu_forward(x, x, n);
  device_.narrow_half(out, x, n, half_format());
}

// Its backward, threshold_backward on the widened 16-bit output and gradient: `out <= 0 ? 0 : dout`.
void Model::half_relu_backward(uint16_t* dinp, const uint16_t* dout, const uint16_t* out, int64_t n) {
  const float* o = widen(fh_, out, n);
  float* d = widen(fg_, dout, n);
  device_.relu_backward(d, d, o, n);
  device_.narrow_half(dinp, d, n, half_format());
}

uint16_t* Model::half_scratch(Tensor& t, int64_t n) {
  if (t.numel() < n || t.dtype() != act_dtype()) t = Tensor({n}, MemCategory::Activations, tracker_, act_dtype(), device_);
  return t.u16();
}

const float* Model::half_all_reduce_partial(const float* partial, int64_t n, int layer) {
  uint16_t* h = half_scratch(h16b_, n);
  device_.narrow_half(h, partial, n, half_format());
  tp_comm().all_reduce(h, n, act_dtype(), layer);
  return widen(ff_, h, n);
}

void Model::half_sp_split_rows(uint16_t* dst, const uint16_t* src, int64_t width) {
  const int64_t local = padded_ / tp_.degree, begin = tp_.rank * local;
  const int64_t n = std::clamp<int64_t>(batch_ - begin, 0, local);
  const int64_t row_bytes = width * static_cast<int64_t>(sizeof(uint16_t));
  if (n > 0) device_.copy(dst, src + begin * width, n * row_bytes);
  if (n < local) device_.fill_zero(dst + n * width, (local - n) * row_bytes);
}

// model.cpp's sp_layer_forward in 16 bits: the column-parallel Linear gathers its 16-bit input rows,
// the row-parallel one reduce-scatters its 16-bit partial outputs and adds the bias to its rows.
void Model::half_sp_layer_forward(int i, uint16_t* out, const uint16_t* in, ComputeKind kind) {
  const Layer& L = layer(i);
  const int64_t all = padded_, local = padded_ / tp_.degree;
  const HalfFormat f = half_format();
  if (L.kind == LayerKind::ReLU) {
    const int64_t n = sp_rows(i, true) * L.out_features;
    ComputeScope scope(observer_, kind, L.seq_index, layer_forward_cost(i, sp_rows(i, true)));
    return half_relu_forward(out, in, n);
  }
  const float* w = operand(fb_, weight_of(L), L.out_features * L.in_features);
  const float* b = operand(fc_, bias_of(L), L.out_features);
  if (L.tp == TpRole::Column) {
    uint16_t* gathered = sp_gathered(i).u16();
    tp_comm().all_gather(gathered, in, local * L.in_features, act_dtype(), L.seq_index);
    ComputeScope scope(observer_, kind, L.seq_index, layer_forward_cost(i, all));
    float* y = f32_scratch(fd_, all * L.out_features);
    const float* x = widen(fa_, gathered, all * L.in_features);
    device_.linear_forward(y, x, w, b, all, L.in_features, L.out_features);
    device_.narrow_half(out, y, all * L.out_features, f);
    if (L.lora_a >= 0) half_lora_forward(L, out, x, all);
  } else if (L.tp == TpRole::Row) {
    uint16_t* partial = half_scratch(h16a_, all * L.out_features);
    {
      ComputeScope scope(observer_, kind, L.seq_index, layer_forward_cost(i, all));
      float* y = f32_scratch(fd_, all * L.out_features);
      const float* x = widen(fa_, in, all * L.in_features);
      device_.linear_forward(y, x, w, nullptr, all, L.in_features, L.out_features);
      device_.narrow_half(partial, y, all * L.out_features, f);
      if (L.lora_a >= 0) half_lora_forward(L, partial, x, all);  // its partial sum rides g
    }
    tp_comm().reduce_scatter(out, partial, local * L.out_features, act_dtype(), L.seq_index);
    half_add_bias_rows(out, b, local, L.out_features);
  } else {
    ComputeScope scope(observer_, kind, L.seq_index, layer_forward_cost(i, local));
    float* y = f32_scratch(fd_, local * L.out_features);
    const float* x = widen(fa_, in, local * L.in_features);
    device_.linear_forward(y, x, w, b, local, L.in_features, L.out_features);
    device_.narrow_half(out, y, local * L.out_features, f);
    if (L.lora_a >= 0) half_lora_forward(L, out, x, local);
  }
}

// model.cpp's sp_linear_backward in 16 bits: the row layer gathers its 16-bit output gradient rows,
// the column layer reduce-scatters its 16-bit input gradient, and the parameters that saw only this
// rank's rows (the row layer's bias, a replicated Linear) sum their 16-bit partial gradients.
void Model::half_sp_layer_backward(int i, uint16_t* dinp, const uint16_t* dout, const uint16_t* in, const uint16_t* out, bool input,
                                   bool weights, uint16_t* gout) {
  const Layer& L = layer(i);
  const HalfFormat f = half_format();
  if (!input) dinp = nullptr;
  if (L.kind == LayerKind::ReLU) {
    if (!dinp) return;
    const int64_t rows = sp_rows(i, true), n = rows * L.out_features;
    ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index, layer_backward_cost(i, rows, true));
    return half_relu_backward(dinp, dout, out, n);
  }
  const int64_t all = padded_, local = padded_ / tp_.degree, OC = L.out_features;
  const int64_t rows = L.tp == TpRole::Replicated ? local : all;
  const int64_t nw = OC * L.in_features;
  const bool frozen = lora() || !weights;  // LoRA: the base has no gradient; the adapters' follow the base layer's rows
  const Parameter& w = weight_of(L);
  const uint16_t* gout16 = dout;  // every row the layer computed (ZB-H1's W: as its I kept it in `gout`)
  const uint16_t* mine16 = dout;  // this rank's rows
  if (L.tp == TpRole::Row) {
    if (!input && gout) {
      gout16 = gout;
      mine16 = gout + tp_.rank * local * OC;
    } else {
      uint16_t* gathered = gout ? gout : half_scratch(h16a_, all * OC);
      tp_comm().all_gather(gathered, dout, local * OC, act_dtype(), L.seq_index);
      gout16 = gathered;
    }
  }
  float* dx = dinp ? f32_scratch(fe_, rows * L.in_features) : nullptr;  // the column layer's: every row
  float* dw = frozen ? nullptr : f32_scratch(fd_, nw + OC);               // dW, then db (partial where noted)
  if (dw) device_.fill_zero(dw, (nw + OC) * static_cast<int64_t>(sizeof(float)));
  {
    const OpCost cost = !weights ? layer_backward_cost(i, rows, true) - layer_backward_cost(i, rows, false)
                                 : layer_backward_cost(i, rows, dinp != nullptr);
    ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index, cost);
    const float* g = widen(fa_, gout16, rows * OC);
    const float* x = weights ? widen(fb_, L.tp == TpRole::Column ? sp_gathered(i).u16() : in, rows * L.in_features) : nullptr;
    const float* wv = dinp ? operand(fc_, w, nw) : nullptr;
    if (L.tp == TpRole::Row) {
      device_.linear_backward(dx, dw, nullptr, g, x, wv, all, L.in_features, OC);
      // The bias gradient from this rank's rows only: summed over the group below.
      if (dw) device_.linear_backward(nullptr, nullptr, dw + nw, widen(ff_, mine16, local * OC), nullptr, nullptr, local, L.in_features, OC);
    } else {
      device_.linear_backward(dx, dw, dw ? dw + nw : nullptr, g, x, wv, rows, L.in_features, OC);
    }
    if (dw && L.tp != TpRole::Replicated) add_to_grad16(params_[static_cast<size_t>(L.weight)], dw);
    if (dw && L.tp == TpRole::Column) add_to_grad16(params_[static_cast<size_t>(L.bias)], dw + nw);
    if (L.lora_a >= 0) half_lora_backward(L, dx, g, x, rows, weights);
  }
  if (dinp && L.tp == TpRole::Column) {
    uint16_t* full = half_scratch(h16a_, all * L.in_features);
    device_.narrow_half(full, dx, all * L.in_features, f);
    tp_comm().reduce_scatter(dinp, full, local * L.in_features, act_dtype(), L.seq_index);
  } else if (dinp) {
    device_.narrow_half(dinp, dx, rows * L.in_features, f);
  }
  if (weights && lora_split(L)) half_sum_lora_grad(L);
  if (!dw || L.tp == TpRole::Column) return;
  const bool both = L.tp == TpRole::Replicated;
  const float* sum = half_all_reduce_partial(both ? dw : dw + nw, both ? nw + OC : OC, L.seq_index);
  if (both) add_to_grad16(params_[static_cast<size_t>(L.weight)], sum);
  add_to_grad16(params_[static_cast<size_t>(L.bias)], sum + (both ? nw : 0));
}

// peft's Linear.forward on 16-bit tensors, op by op, each result rounded once to 16 bits:
// t = lora_A(x), u = lora_B(t), s = u * scaling, out = result + s.
void Model::half_lora_forward(const Layer& L, uint16_t* out, const float* x, int64_t B) {
  const HalfFormat f = half_format();
  const int64_t r = lora_.rank, n_out = B * L.out_features;
  const float* a = operand(lora_a32_, params_[static_cast<size_t>(L.lora_a)], r * L.in_features);
  const float* bm = operand(lora_b32_, params_[static_cast<size_t>(L.lora_b)], L.out_features * r);
  float* t = f32_scratch(lora_t_, 2 * B * r);
  device_.linear_forward(t, x, a, nullptr, B, L.in_features, r);
  device_.round_half(t, B * r, f);
  float* u = f32_scratch(lora_d_, n_out);
  device_.linear_forward(u, t, bm, nullptr, B, r, L.out_features);
  // out = round(out + round(round(u) * scaling)), element by element
  device_.round_half(u, n_out, f);
  device_.scale(u, n_out, lora_.scaling());
  device_.round_half(u, n_out, f);
  float* sum = widen(fh_, out, n_out);
  device_.accumulate(sum, u, n_out, false);
  device_.narrow_half(out, sum, n_out, f);
}

// Its backward as autograd runs it on 16-bit tensors: du = ds * scaling, dB += du^T t, dt = du B,
// dA += dt^T x, and x's gradient the sum of the base's and the adapter's, each rounded to 16 bits
// before the one rounded sum. `dx` holds the base's float32 input gradient (null for the first layer).
void Model::half_lora_backward(const Layer& L, float* dx, const float* dy, const float* x, int64_t B, bool weights) {
  const HalfFormat f = half_format();
  const int64_t r = lora_.rank, n_out = B * L.out_features;
  Parameter& A = params_[static_cast<size_t>(L.lora_a)];
  Parameter& Bm = params_[static_cast<size_t>(L.lora_b)];
  const float* a = operand(lora_a32_, A, A.numel);
  const float* bm = operand(lora_b32_, Bm, Bm.numel);
  float* t = f32_scratch(lora_t_, 2 * B * r);  // recomputed, as lora_backward does
  float* dt = t + B * r;
  if (weights) {
    device_.linear_forward(t, x, a, nullptr, B, L.in_features, r);
    device_.round_half(t, B * r, f);
  }
  float* du = f32_scratch(lora_d_, n_out);
  device_.scale_copy(du, dy, n_out, lora_.scaling());
  device_.round_half(du, n_out, f);
  float* g = f32_scratch(lora_g_, Bm.numel + A.numel + (dx ? B * L.in_features : 0));  // dB, dA, dx's adapter part
  if (weights) device_.fill_zero(g, (Bm.numel + A.numel) * static_cast<int64_t>(sizeof(float)));
  device_.linear_backward(dt, weights ? g : nullptr, nullptr, du, weights ? t : nullptr, bm, B, r, L.out_features);
  device_.round_half(dt, B * r, f);
  float* dxl = dx ? g + Bm.numel + A.numel : nullptr;
  if (dxl || weights) device_.linear_backward(dxl, weights ? g + Bm.numel : nullptr, nullptr, dt, weights ? x : nullptr, a, B, L.in_features, r);
  // On a TP shard a partial gradient (lora_partial) stays in lora_g_ for half_sum_lora_grad, the
  // 16-bit form of sum_lora_grad, after the layer's compute.
  const LoraPartial lp = weights && lora_split(L) ? lora_partial(L) : LoraPartial{};
  if (weights && lp.first != L.lora_b && lp.second != L.lora_b) add_to_grad16(Bm, g);
  if (weights && lp.first != L.lora_a && lp.second != L.lora_a) add_to_grad16(A, g + Bm.numel);
  if (dx) {  // dx = round(round(dx) + round(dxl)), element by element
    const int64_t n = B * L.in_features;
    device_.round_half(dx, n, f);
    device_.round_half(dxl, n, f);
    device_.accumulate(dx, dxl, n, false);
    device_.round_half(dx, n, f);
  }
}

void Model::add_to_grad16(Parameter& p, const float* add) {
  if (amp()) {  // the 16-bit gradient (rounded once) widened by the cast's backward into the float32 .grad
    float* g = f32_scratch(fh_, p.numel);
    device_.copy(g, add, p.numel * static_cast<int64_t>(sizeof(float)));
    device_.round_half(g, p.numel, half_format());
    device_.accumulate(p.grad, g, p.numel, false);
    return;
  }
  float* g = widen(fh_, p.grad16, p.numel);
  device_.accumulate(g, add, p.numel, false);
  device_.narrow_half(p.grad16, g, p.numel, half_format());
}

void Model::half_backward(const float* dlogits, const GradReadyHook& on_grad_ready) {
  const int64_t B = batch_;
  const int64_t C = layer(num_layers() - 1).out_features;
  int first = 0;  // the first computed layer needs no input gradient
  while (first < num_layers() && layer_skipped(first)) first++;
  uint16_t* d0 = dbuf_[0].u16();
  if (sequence_parallel()) {  // this rank's rows of it, as the float32 backward splits them
    uint16_t* whole = half_scratch(h16a_, B * C);
    device_.narrow_half(whole, dlogits, B * C, half_format());
    half_sp_split_rows(d0, whole, C);
  } else {
    device_.narrow_half(d0, dlogits, B * C, half_format());  // the (scaled) loss gradient in 16 bits
  }
  const uint16_t* dout = d0;
  for (int i = num_layers() - 1; i >= 0; i--) {
    if (layer_skipped(i)) continue;
    uint16_t* dinp = i > first ? (dout == dbuf_[0].u16() ? dbuf_[1].u16() : dbuf_[0].u16()) : nullptr;
    if (checkpointing_ && keeps_output(i)) half_recompute_block(i);  // a block's last layer: run it again first
    const uint16_t* out = checkpointing_ ? recompute_.u16() : acts_[static_cast<size_t>(i)].u16();
    gate_layer(i, true);
    if (hooks_) hooks_->before_backward(i);
    half_layer_backward(i, dinp, dout, layer_in16_[static_cast<size_t>(i)], out, B);
    if (hooks_) hooks_->after_backward(i);
    const Layer& L = layer(i);
    if (L.kind == LayerKind::Linear && on_grad_ready) {
      on_grad_ready(L.bias);
      on_grad_ready(L.weight);
    }
    dout = dinp;
  }
}

// model.cpp's recompute_block in 16 bits: the block's Linear widens the same 16-bit input and weights,
// runs the same float32 kernel and rounds once, exactly as the forward did (torch.utils.checkpoint
// recomputes under the forward's dtype and autocast state; docs/course_sources.md §6d), so the
// recomputed activations and the gradients are bit-identical to a run that kept them.
void Model::half_recompute_block(int last) {
  const int first = layer(last).kind == LayerKind::ReLU ? last - 1 : last;
  uint16_t* buf = recompute_.u16();
  for (int i = first; i <= last; i++) {
    if (hooks_) hooks_->before_recompute(i);
    half_layer_forward(i, buf, i == first ? layer_in16_[static_cast<size_t>(i)] : buf, batch_, ComputeKind::Recompute);
    if (hooks_) hooks_->after_recompute(i);
  }
}

// Parameter gradients accumulate as torch's .grad does for 16-bit parameters: the float32 product is
// added to the 16-bit gradient and the sum rounded once.
void Model::half_layer_backward(int i, uint16_t* dinp, const uint16_t* dout, const uint16_t* in, const uint16_t* out, int64_t B) {
  if (sequence_parallel()) return half_sp_layer_backward(i, dinp, dout, in, out);
  const Layer& L = layer(i);
  const HalfFormat f = half_format();
  const int64_t n_out = B * L.out_features;
  {
    ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index, layer_backward_cost(i, B, dinp != nullptr));
    if (L.kind == LayerKind::ReLU) {
      if (dinp) half_relu_backward(dinp, dout, out, n_out);
      return;
    }
    const int64_t nw = L.out_features * L.in_features;
    const float* dy = widen(fa_, dout, n_out);
    const float* x = widen(fb_, in, B * L.in_features);
    const float* w = dinp ? operand(fc_, weight_of(L), nw) : nullptr;
    float* dw = lora() ? nullptr : f32_scratch(fd_, nw + L.out_features);  // dW, then db; none for a frozen base
    if (dw) device_.fill_zero(dw, (nw + L.out_features) * static_cast<int64_t>(sizeof(float)));
    float* dx = dinp ? f32_scratch(fe_, B * L.in_features) : nullptr;
    device_.linear_backward(dx, dw, dw ? dw + nw : nullptr, dy, x, w, B, L.in_features, L.out_features);
    if (dw) {
      add_to_grad16(params_[static_cast<size_t>(L.weight)], dw);
      add_to_grad16(params_[static_cast<size_t>(L.bias)], dw + nw);
    }
    if (L.lora_a >= 0) half_lora_backward(L, dx, dy, x, B);
    if (dinp) device_.narrow_half(dinp, dx, B * L.in_features, f);
  }
  // f backward: the column-parallel Linear's 16-bit input gradient summed over the TP group.
  if (dinp && L.tp == TpRole::Column) tp_comm().all_reduce(dinp, B * L.in_features, act_dtype(), L.seq_index);
  if (lora_split(L)) half_sum_lora_grad(L);
}

void Model::layer_forward16(int i, uint16_t* out, const uint16_t* in, int64_t B, bool recompute) {
  DTLAB_CHECK(half_acts() && !sequence_parallel(), "layer_forward16() runs a 16-bit model without sequence parallelism");
  half_layer_forward(i, out, in, B, recompute ? ComputeKind::Recompute : ComputeKind::LayerForward);
}

void Model::layer_backward16(int i, uint16_t* dinp, const uint16_t* dout, const uint16_t* in, const uint16_t* out, int64_t B) {
  DTLAB_CHECK(half_acts() && !sequence_parallel(), "layer_backward16() runs a 16-bit model without sequence parallelism");
  half_layer_backward(i, dinp, dout, in, out, B);
}

// half_layer_backward's input half (zero bubble's I): the same input gradient, rounded the same way.
void Model::layer_backward_input16(int i, uint16_t* dinp, const uint16_t* dout, const uint16_t* out, int64_t B) {
  DTLAB_CHECK(half_acts() && !sequence_parallel(), "layer_backward_input16() runs a 16-bit model without sequence parallelism");
  const Layer& L = layer(i);
  const HalfFormat f = half_format();
  {
    ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index,
                       layer_backward_cost(i, B, true) - layer_backward_cost(i, B, false));
    if (L.kind == LayerKind::ReLU) return half_relu_backward(dinp, dout, out, B * L.out_features);
    const float* dy = widen(fa_, dout, B * L.out_features);
    const float* w = operand(fc_, weight_of(L), L.out_features * L.in_features);
    float* dx = f32_scratch(fe_, B * L.in_features);
    device_.linear_backward(dx, nullptr, nullptr, dy, nullptr, w, B, L.in_features, L.out_features);
    if (L.lora_a >= 0) half_lora_backward(L, dx, dy, nullptr, B, false);
    device_.narrow_half(dinp, dx, B * L.in_features, f);
  }
  if (L.tp == TpRole::Column) tp_comm().all_reduce(dinp, B * L.in_features, act_dtype(), L.seq_index);
}

// Its weight half (W): the parameter gradients half_layer_backward adds, from the same operands.
void Model::layer_backward_weight16(int i, const uint16_t* dout, const uint16_t* in, int64_t B) {
  DTLAB_CHECK(half_acts() && !sequence_parallel(), "layer_backward_weight16() runs a 16-bit model without sequence parallelism");
  const Layer& L = layer(i);
  if (L.kind != LayerKind::Linear) return;  // a ReLU has no weights
  ComputeScope scope(observer_, ComputeKind::LayerBackward, L.seq_index, layer_backward_cost(i, B, false));
  const float* dy = widen(fa_, dout, B * L.out_features);
  const float* x = widen(fb_, in, B * L.in_features);
  if (lora()) {  // the frozen base has no gradient; the adapters' is the weight half
    if (L.lora_a >= 0) half_lora_backward(L, nullptr, dy, x, B, true);
    if (lora_split(L)) half_sum_lora_grad(L);
    return;
  }
  const int64_t nw = L.out_features * L.in_features;
  float* dw = f32_scratch(fd_, nw + L.out_features);
  device_.fill_zero(dw, (nw + L.out_features) * static_cast<int64_t>(sizeof(float)));
  device_.linear_backward(nullptr, dw, dw + nw, dy, x, nullptr, B, L.in_features, L.out_features);
  add_to_grad16(params_[static_cast<size_t>(L.weight)], dw);
  add_to_grad16(params_[static_cast<size_t>(L.bias)], dw + nw);
}

// sum_lora_grad in 16 bits: the partial gradient half_lora_backward left in lora_g_ ([dB, dA, ...]),
// rounded, summed over the TP group and added to the 16-bit gradients.
void Model::half_sum_lora_grad(const Layer& L) {
  const LoraPartial lp = lora_partial(L);
  Parameter& p = params_[static_cast<size_t>(lp.first)];
  Parameter* q = lp.second >= 0 ? &params_[static_cast<size_t>(lp.second)] : nullptr;
  const float* partial = lora_g_.f32() + (lp.first == L.lora_a ? params_[static_cast<size_t>(L.lora_b)].numel : 0);
  const float* sum = half_all_reduce_partial(partial, p.numel + (q ? q->numel : 0), L.seq_index);
  add_to_grad16(p, sum);
  if (q) add_to_grad16(*q, sum + p.numel);
}

}  // namespace dtlab
