// The transformer's layers as loops over host memory (the CPU device's implementation of
// engine/core/device.h's transformer ops; engine/cuda/gpt_kernels.cu mirrors them on a GPU). Outputs
// first, sizes last; a backward adds into parameter gradients (and LayerNorm's into its input's
// gradient), as ops.h's do. The ops nanoGPT runs: F.layer_norm (eps 1e-5, biased variance), nn.GELU()
// (erf), causal softmax attention with 1/sqrt(head size), nn.Embedding's lookup.
#pragma once
#include <cstdint>

#include "engine/core/half.h"

namespace dtlab {

inline constexpr float kLayerNormEps = 1e-5f;

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int64_t N,
                       int64_t C);
// dw and db may be null together (frozen weights).
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C);
void gelu_forward(float* out, const float* inp, int64_t N);
void gelu_backward(float* d, const float* dout, const float* inp, int64_t N);
// round16: autocast's roundings inside (engine/core/device.h); null: float32 throughout.
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                       const HalfFormat* round16 = nullptr);
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int64_t B,
                        int64_t T, int64_t C, int64_t NH, const HalfFormat* round16 = nullptr);
// x[i] = wte[idx[s T + t]] + wpe[t] for row i of sample s = i / Tl at position t = t0 + i % Tl.
void embedding_forward(float* x, const float* wte, const float* wpe, const int64_t* idx, int64_t R, int64_t Tl, int64_t T,
                       int64_t t0, int64_t C);
// Rows in order: dwte[token] += dx[i], dwpe[t] += dx[i].
void embedding_backward(float* dwte, float* dwpe, const float* dx, const int64_t* idx, int64_t R, int64_t Tl, int64_t T,
                        int64_t t0, int64_t C);

}  // namespace dtlab
