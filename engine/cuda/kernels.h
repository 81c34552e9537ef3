// The CUDA kernels' launchers, one per kernel, outputs first and sizes last like the CPU ops.
// Everything is enqueued on `s` and returns at once. Kept free of engine headers (only
// optim_math.h) so the .cu files compile quickly: layer_kernels.cu, optim_kernels.cu, reduce_kernels.cu.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

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

// ---- optim_kernels.cu (the element updates of optim_math.h) ----
// buf: momentum buffer or null; first: the optimizer's first step (buf = d_p).
void launch_sgd_step(cudaStream_t s, float* params, const float* grads, float* buf, int64_t n,
                     SgdCoeffs k, bool first);
void launch_adamw_step(cudaStream_t s, float* params, const float* grads, float* m, float* v,
                       int64_t n, AdamWCoeffs k);

// ---- reduce_kernels.cu (collectives) ----
// dst = a op b element-wise, op sum (max = false) or max; dst may be a. Pointers may lie on peer
// devices (peer access enabled).
void launch_reduce_f32(cudaStream_t s, float* dst, const float* a, const float* b, int64_t n, bool max);
void launch_reduce_i64(cudaStream_t s, int64_t* dst, const int64_t* a, const int64_t* b, int64_t n, bool max);
void launch_scale(cudaStream_t s, float* buf, float factor, int64_t n);  // Avg's last step
void launch_scale_copy(cudaStream_t s, float* dst, const float* src, float factor, int64_t n);  // dst = src * factor

}  // namespace dtlab::cuda
