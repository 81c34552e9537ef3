// The engine's layer ops on a GPU, with the CPU ops' signatures (engine/core/ops.h) plus the rank's
// device first: same layouts, same accumulate-into-parameter-gradients contract, same results to
// float rounding (tests/test_cuda.cpp prints the max difference of each). All pointers are device
// memory; everything runs on the rank's compute stream and returns without waiting. GEMMs go
// through cuBLAS in plain FP32 (no TF32).
#pragma once
#include <cstdint>

#include "engine/core/half.h"
#include "engine/cuda/rank_device.h"

namespace dtlab::cuda {

// out = inp @ weight^T + bias        out (B, OC), inp (B, C), weight (OC, C), bias (OC) or null
void linear_forward(const RankDevice& dev, float* out, const float* inp, const float* weight,
                    const float* bias, int64_t B, int64_t C, int64_t OC);
// dinp = dout @ weight (overwritten; skipped when null); dweight += dout^T @ inp, dbias += column
// sums of dout (each skipped when null)
void linear_backward(const RankDevice& dev, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int64_t B, int64_t C, int64_t OC);

void relu_forward(const RankDevice& dev, float* out, const float* inp, int64_t N);
void relu_backward(const RankDevice& dev, float* dinp, const float* dout, const float* out, int64_t N);

// Softmax cross-entropy with mean reduction. probs (B, C), losses (B) per row, loss (1) the mean,
// left on the device (read it when the step's loss is printed, not every step). Targets (B) must
// lie in [0, C): a kernel cannot throw, so check them on the host before upload (a row with a bad
// target gets a NaN loss).
void cross_entropy_forward(const RankDevice& dev, float* probs, float* losses, float* loss,
                           const float* logits, const int64_t* targets, int64_t B, int64_t C);
// dlogits = (probs - onehot(targets)) * scale; scale is 1/B for the mean.
void cross_entropy_backward(const RankDevice& dev, float* dlogits, const float* probs,
                            const int64_t* targets, int64_t B, int64_t C, float scale);

// Causal self-attention (engine/core/gpt_ops.h's attention_forward/backward): per sample, cuBLAS
// strided-batched GEMMs over the NH heads read q, k and v in place in the fused qkv (leading
// dimension 3C); the softmax and its backward are kernels. `scratch` holds NH x T x T floats.
// round16: autocast's roundings between the ops (engine/core/device.h), as the CPU's.
void attention_forward(const RankDevice& dev, float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, const HalfFormat* round16);
void attention_backward(const RankDevice& dev, float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH, const HalfFormat* round16);

}  // namespace dtlab::cuda
