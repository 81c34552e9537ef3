// The CUDA kernels' launchers, one per kernel, outputs first and sizes last like the CPU ops.
// Everything is enqueued on `s` and returns at once. Kept free of engine headers (only
// optim_math.h) so the .cu files compile quickly: layer_kernels.cu, optim_kernels.cu, reduce_kernels.cu.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/core/half.h"
#include "engine/core/optim_math.h"

namespace dtlab::cuda {

// ---- layer_kernels.cu ----
// out[b, :] = bias for every row b: the seed a GEMM with beta = 1 accumulates onto (as ops.cpp does).
void launch_bias_fill(cudaStream_t s, float* out, const float* bias, int64_t B, int64_t OC);
// dbias[o] += sum over b of dout[b, o], rows added in order b = 0, 1, ... (as ops.cpp does).
void launch_bias_backward(cudaStream_t s, float* dbias, const float* dout, int64_t B, int64_t OC);
void launch_relu_forward(cudaStream_t s, float* out, const float* inp, int64_t N);
void launch_relu_backward(cudaStream_t s, float* dinp, const float* dout, const float* out, int64_t N);
// probs (B, C) the softmax, losses (B) each row's -log softmax at its target, loss (1) their mean
// (summed in double in row order). A target outside [0, C) gives that row a NaN loss.
void launch_cross_entropy_forward(cudaStream_t s, float* probs, float* losses, float* loss,
                                  const float* logits, const int64_t* targets, int64_t B, int64_t C);
// stats[0] += loss[0] * B (in double), stats[1] += rows whose argmax (lowest index on ties) equals
// the target. `scratch` (B floats) is overwritten; enqueue after launch_cross_entropy_forward.
void launch_loss_stats(cudaStream_t s, double* stats, float* scratch, const float* loss, const float* logits,
                       const int64_t* targets, int64_t B, int64_t C);
// dlogits = (probs - onehot(targets)) * scale
void launch_cross_entropy_backward(cudaStream_t s, float* dlogits, const float* probs,
                                   const int64_t* targets, int64_t B, int64_t C, float scale);

// ---- gpt_kernels.cu (engine/core/gpt_ops.h's contracts) ----
void launch_layernorm_forward(cudaStream_t s, float* out, float* mean, float* rstd, const float* inp, const float* w,
                              const float* b, int64_t N, int64_t C);
// dinp (when not null), dw and db (when not null: frozen weights) += their gradients.
void launch_layernorm_backward(cudaStream_t s, float* dinp, float* dw, float* db, const float* dout, const float* inp,
                               const float* w, const float* mean, const float* rstd, int64_t N, int64_t C);
void launch_gelu_forward(cudaStream_t s, float* out, const float* inp, int64_t N);
void launch_gelu_backward(cudaStream_t s, float* d, const float* dout, const float* inp, int64_t N);
// `rows` rows of T scores, row r at position r % T: softmax over positions 0..r % T, zeros after.
void launch_causal_softmax(cudaStream_t s, float* att, int64_t rows, int64_t T);
// datt = att (datt - rowsum(att datt)) scale, zeros after the diagonal.
void launch_causal_softmax_backward(cudaStream_t s, float* datt, const float* att, int64_t rows, int64_t T, float scale);
void launch_embedding_forward(cudaStream_t s, float* x, const float* wte, const float* wpe, const int64_t* idx, int64_t R,
                              int64_t Tl, int64_t T, int64_t t0, int64_t C);
void launch_embedding_backward(cudaStream_t s, float* dwte, float* dwpe, const float* dx, const int64_t* idx, int64_t R,
                               int64_t Tl, int64_t T, int64_t t0, int64_t C);
void launch_add(cudaStream_t s, float* out, const float* a, const float* b, int64_t n);  // out = a + b
void launch_add_rows(cudaStream_t s, float* y, const float* bias, int64_t R, int64_t C);  // y[i, :] += bias

// ---- optim_kernels.cu (the element updates of optim_math.h) ----
// buf: momentum buffer or null; first: the optimizer's first step (buf = d_p).
void launch_sgd_step(cudaStream_t s, float* params, const float* grads, float* buf, int64_t n,
                     SgdCoeffs k, bool first);
void launch_adamw_step(cudaStream_t s, float* params, const float* grads, float* m, float* v,
                       int64_t n, AdamWCoeffs k);

// ---- half_kernels.cu (engine/core/half.h's conversions, bit for bit) ----
void launch_widen_half(cudaStream_t s, float* dst, const uint16_t* src, int64_t n, HalfFormat f);
void launch_narrow_half(cudaStream_t s, uint16_t* dst, const float* src, int64_t n, HalfFormat f);
void launch_round_half(cudaStream_t s, float* x, int64_t n, HalfFormat f);  // in place
void launch_half_nonfinite(cudaStream_t s, int64_t* bad, const uint16_t* x, int64_t n, HalfFormat f);  // *bad = 1 on inf or NaN
void launch_nonfinite(cudaStream_t s, int64_t* bad, const float* x, int64_t n);  // the same for float32
// dst = a op b on 16-bit elements, each in float and rounded once (reduce_kernels.h's reduce_half).
void launch_reduce_half(cudaStream_t s, uint16_t* dst, const uint16_t* a, const uint16_t* b, int64_t n, bool max, HalfFormat f);

// ---- reduce_kernels.cu (collectives) ----
// dst = a op b element-wise, op sum (max = false) or max; dst may be a. Pointers may lie on peer
// devices (peer access enabled).
void launch_reduce_f32(cudaStream_t s, float* dst, const float* a, const float* b, int64_t n, bool max);
void launch_reduce_i64(cudaStream_t s, int64_t* dst, const int64_t* a, const int64_t* b, int64_t n, bool max);
// One fused ring step (plan.h's RingStepWork): dst = (reduce ? dst op src : src) * scale in one pass,
// src read in place on the peer's buffer; scale 1 except on Avg's last reduce-scatter step (1 / n),
// rounding as launch_reduce_f32 followed by launch_scale.
void launch_reduce_copy_f32(cudaStream_t s, float* dst, const float* src, int64_t n, bool reduce, bool max, float scale);
void launch_scale(cudaStream_t s, float* buf, float factor, int64_t n);  // Avg's last step
void launch_scale_copy(cudaStream_t s, float* dst, const float* src, float factor, int64_t n);  // dst = src * factor

}  // namespace dtlab::cuda
