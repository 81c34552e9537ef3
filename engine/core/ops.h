// Layer kernels as forward/backward pairs over raw float pointers: outputs first, sizes last
// (llm.c's convention). Backward kernels ACCUMULATE into parameter gradients (+=), like torch's
// .grad, so gradient accumulation and no_sync work by simply not zeroing; input gradients are
// overwritten. Every kernel has a plain-loop reference in tests/ checked against finite differences.
#pragma once
#include <cstdint>

namespace dtlab {

// out = inp @ weight^T + bias        out (B, OC), inp (B, C), weight (OC, C), bias (OC) or null
void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int64_t B, int64_t C, int64_t OC);
// dinp = dout @ weight (overwritten; skipped when dinp is null, e.g. for the first layer)
// dweight += dout^T @ inp, dbias += sum over rows of dout (skipped when null)
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t B, int64_t C, int64_t OC);

// out = max(inp, 0)     (N), as torch.relu: NaN propagates, -0.0 stays -0.0
void relu_forward(float* out, const float* inp, int64_t N);
// dinp = 0 where out <= 0, else dout (torch's threshold_backward, so a NaN output passes dout on).
void relu_backward(float* dinp, const float* dout, const float* out, int64_t N);

// Softmax cross-entropy with mean reduction (torch.nn.functional.cross_entropy defaults).
// probs (B, C) receives the softmax; returns the mean loss. Targets must lie in [0, C).
float cross_entropy_forward(float* probs, const float* logits, const int64_t* targets,
                            int64_t B, int64_t C);
// dlogits = (probs - onehot(targets)) * scale; scale is 1/B for the mean.
void cross_entropy_backward(float* dlogits, const float* probs, const int64_t* targets,
                            int64_t B, int64_t C, float scale);
// Number of rows whose argmax equals the target (ties go to the lowest index, like torch.argmax).
int64_t count_correct(const float* logits, const int64_t* targets, int64_t B, int64_t C);

// BLAS threads used by the GEMMs (OpenBLAS); 0 restores the library's default (OPENBLAS_NUM_THREADS,
// else one per core).
void set_compute_threads(int n);
int compute_threads();

}  // namespace dtlab
