#include "engine/cuda/ops.h"

#include <cmath>
#include <string>

#include "engine/cuda/runtime.h"
#include "engine/cuda/kernels.h"

namespace dtlab::cuda {

namespace {

void check_blas(cublasStatus_t st, const char* call, int line) {
  if (st != CUBLAS_STATUS_SUCCESS) fail_library(__FILE__, line, call, cublasGetStatusString(st));
}

int i32(int64_t v) { return static_cast<int>(v); }

}  // namespace

// cuBLAS is column-major: a row-major (R, K) matrix is its column-major transpose (K, R) with
// leading dimension K. So each row-major product X = A @ B is computed as X^T = B^T @ A^T, which
// cuBLAS reads straight from the row-major storage; the transposes below follow from that.

void linear_forward(const RankDevice& dev, float* out, const float* inp, const float* weight,
                    const float* bias, int64_t B, int64_t C, int64_t OC) {
  // Seed each row with the bias and let the GEMM accumulate on top (beta = 1), as ops.cpp does.
  if (bias) launch_bias_fill(dev.compute(), out, bias, B, OC);
  const float one = 1.0f, beta = bias ? 1.0f : 0.0f;
  // out^T (OC, B) = weight (OC, C) [stored as (C, OC), so transposed] @ inp^T (C, B)
  check_blas(cublasSgemm(dev.blas(), CUBLAS_OP_T, CUBLAS_OP_N, i32(OC), i32(B), i32(C), &one, weight,
                         i32(C), inp, i32(C), &beta, out, i32(OC)),
             "cublasSgemm (linear forward)", __LINE__);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void linear_backward(const RankDevice& dev, float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int64_t B, int64_t C, int64_t OC) {
  const float one = 1.0f, zero = 0.0f;
  if (dinp) {  // dinp^T (C, B) = weight^T (C, OC) @ dout^T (OC, B)
    check_blas(cublasSgemm(dev.blas(), CUBLAS_OP_N, CUBLAS_OP_N, i32(C), i32(B), i32(OC), &one, weight,
                           i32(C), dout, i32(OC), &zero, dinp, i32(C)),
               "cublasSgemm (linear d input)", __LINE__);
  }
  if (dweight) {  // dweight^T (C, OC) += inp^T (C, B) @ dout (B, OC)
    check_blas(cublasSgemm(dev.blas(), CUBLAS_OP_N, CUBLAS_OP_T, i32(C), i32(OC), i32(B), &one, inp,
                           i32(C), dout, i32(OC), &one, dweight, i32(C)),
               "cublasSgemm (linear d weight)", __LINE__);
  }
  if (dbias) launch_bias_backward(dev.compute(), dbias, dout, B, OC);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void relu_forward(const RankDevice& dev, float* out, const float* inp, int64_t N) {
  launch_relu_forward(dev.compute(), out, inp, N);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void relu_backward(const RankDevice& dev, float* dinp, const float* dout, const float* out, int64_t N) {
  launch_relu_backward(dev.compute(), dinp, dout, out, N);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void cross_entropy_forward(const RankDevice& dev, float* probs, float* losses, float* loss,
                           const float* logits, const int64_t* targets, int64_t B, int64_t C) {
  launch_cross_entropy_forward(dev.compute(), probs, losses, loss, logits, targets, B, C);
  DTLAB_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(const RankDevice& dev, float* dlogits, const float* probs,
                            const int64_t* targets, int64_t B, int64_t C, float scale) {
  launch_cross_entropy_backward(dev.compute(), dlogits, probs, targets, B, C, scale);
  DTLAB_CUDA_CHECK_LAUNCH();
}

// Row-major (T, hs) slices of the fused qkv (leading dimension 3C) are column-major (hs, T) ones; each
// head's product below is the column-major form of the row-major one in its comment.
namespace {

void batched(const RankDevice& dev, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, float alpha,
             const float* A, int64_t lda, int64_t sa, const float* Bm, int64_t ldb, int64_t sb, float* Cm, int64_t ldc,
             int64_t sc, int64_t batch, const char* what) {
  const float beta = 0.0f;
  check_blas(cublasSgemmStridedBatched(dev.blas(), ta, tb, i32(m), i32(n), i32(k), &alpha, A, i32(lda), sa, Bm, i32(ldb), sb,
                                       &beta, Cm, i32(ldc), sc, i32(batch)),
             what, __LINE__);
}

}  // namespace

void attention_forward(const RankDevice& dev, float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, const HalfFormat* round16) {
  const int64_t hs = C / NH, C3 = 3 * C, n = B * NH * T * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int64_t b = 0; b < B; b++) {
    const float* q = qkv + b * T * C3;
    float* a = att + b * NH * T * T;
    // scores (T, T) = scale q k^T (autocast: q k^T rounded, then scaled and rounded)
    batched(dev, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, round16 ? 1.0f : scale, q + C, C3, hs, q, C3, hs, a, T, T * T, NH,
            "cublasSgemmStridedBatched (q k^T)");
  }
  if (round16) {  // (the masked entries above the diagonal are rounded too; the softmax zeroes them)
    launch_round_half(dev.compute(), att, n, *round16);
    launch_scale(dev.compute(), att, scale, n);
    launch_round_half(dev.compute(), att, n, *round16);
  }
  launch_causal_softmax(dev.compute(), att, B * NH * T, T);
  if (round16) launch_round_half(dev.compute(), att, n, *round16);  // the 16-bit probabilities att v reads
  for (int64_t b = 0; b < B; b++) {
    const float* q = qkv + b * T * C3;
    // y (T, hs) = att v, the heads side by side in out (B T, C)
    batched(dev, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, q + 2 * C, C3, hs, att + b * NH * T * T, T, T * T, out + b * T * C, C,
            hs, NH, "cublasSgemmStridedBatched (att v)");
  }
  DTLAB_CUDA_CHECK_LAUNCH();
}

void attention_backward(const RankDevice& dev, float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int64_t B, int64_t T, int64_t C, int64_t NH, const HalfFormat* round16) {
  const int64_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int64_t b = 0; b < B; b++) {
    const float* q = qkv + b * T * C3;
    const float* a = att + b * NH * T * T;
    const float* dy = dout + b * T * C;
    float* dq = dqkv + b * T * C3;
    // dv (T, hs) = att^T dy
    batched(dev, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dy, C, hs, a, T, T * T, dq + 2 * C, C3, hs, NH,
            "cublasSgemmStridedBatched (att^T dy)");
    // datt (T, T) = dy v^T
    batched(dev, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, q + 2 * C, C3, hs, dy, C, hs, scratch, T, T * T, NH,
            "cublasSgemmStridedBatched (dy v^T)");
    if (!round16) {
      launch_causal_softmax_backward(dev.compute(), scratch, a, NH * T, T, scale);
    } else {  // dy v^T, the softmax's backward and the scaling's, each rounded (the CPU's order)
      const int64_t n = NH * T * T;
      launch_round_half(dev.compute(), scratch, n, *round16);
      launch_causal_softmax_backward(dev.compute(), scratch, a, NH * T, T, 1.0f);
      launch_round_half(dev.compute(), scratch, n, *round16);
      launch_scale(dev.compute(), scratch, scale, n);
      launch_round_half(dev.compute(), scratch, n, *round16);
    }
    // dq (T, hs) = dpre k
    batched(dev, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, q + C, C3, hs, scratch, T, T * T, dq, C3, hs, NH,
            "cublasSgemmStridedBatched (dpre k)");
    // dk (T, hs) = dpre^T q
    batched(dev, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, q, C3, hs, scratch, T, T * T, dq + C, C3, hs, NH,
            "cublasSgemmStridedBatched (dpre^T q)");
  }
  DTLAB_CUDA_CHECK_LAUNCH();
}

}  // namespace dtlab::cuda
