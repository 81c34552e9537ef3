// The transformer's kernels: LayerNorm, GELU, the causal softmax of attention, embeddings and the
// element-wise adds. Each mirrors its loop in engine/core/gpt_ops.cpp (the same formulas; sums in
// double where the CPU sums in double), so the GPU's GPT stays within float rounding of the CPU's.
// Row kernels give each row one warp (8 rows a block); column sums walk the rows in a fixed order,
// so every result is the same from run to run.
#include <cfloat>
#include <cmath>

#include "engine/cuda/kernels.h"
#include "engine/cuda/launch.cuh"

namespace dtlab::cuda {

namespace {

constexpr int kRowsPerBlock = kBlock / 32;
constexpr float kLnEps = 1e-5f;  // engine/core/gpt_ops.h's kLayerNormEps (nn.LayerNorm's default)

unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(std::clamp<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, 1, 65535));
}

__device__ double warp_sum(double v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ float warp_max(float v) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// A grid-stride loop over rows, one warp each.
#define DTLAB_WARP_ROWS(row, rows)                                                                     \
  for (int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerBlock) + threadIdx.x / 32; row < (rows); \
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock)

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                         const float* b, int64_t N, int64_t C) {
  const int lane = threadIdx.x % 32;
  DTLAB_WARP_ROWS(i, N) {
    const float* x = inp + i * C;
    double m = 0;
    for (int64_t c = lane; c < C; c += 32) m += x[c];
    m = warp_sum(m) / static_cast<double>(C);
    double v = 0;
    for (int64_t c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
    v = warp_sum(v) / static_cast<double>(C);
    const float s = static_cast<float>(1.0 / sqrt(v + kLnEps));
    const float mf = static_cast<float>(m);
    float* o = out + i * C;
    for (int64_t c = lane; c < C; c += 32) o[c] = (x[c] - mf) * s * w[c] + b[c];
    if (lane == 0) {
      mean[i] = mf;
      rstd[i] = s;
    }
  }
}

// dinp += the input gradient, one warp per row.
__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                                const float* mean, const float* rstd, int64_t N, int64_t C) {
  const int lane = threadIdx.x % 32;
  DTLAB_WARP_ROWS(i, N) {
    const float* dy = dout + i * C;
    const float* x = inp + i * C;
    const float m = mean[i], s = rstd[i];
    double dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t c = lane; c < C; c += 32) {
      const float norm = (x[c] - m) * s;
      const float dnorm = w[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += static_cast<double>(dnorm) * norm;
    }
    const float a = static_cast<float>(warp_sum(dnorm_mean) / static_cast<double>(C));
    const float bb = static_cast<float>(warp_sum(dnorm_norm_mean) / static_cast<double>(C));
    float* dx = dinp + i * C;
    for (int64_t c = lane; c < C; c += 32) {
      const float norm = (x[c] - m) * s;
      dx[c] += (w[c] * dy[c] - a - norm * bb) * s;
    }
  }
}

// dw += sum of norm * dout, db += sum of dout over the rows: a block takes 32 columns, its 8 warps
// rows r = warp, warp + 8, ... in order (in double), and the 8 partial sums are added in warp order.
__global__ void layernorm_backward_params_kernel(float* dw, float* db, const float* dout, const float* inp,
                                                 const float* mean, const float* rstd, int64_t N, int64_t C) {
  __shared__ double sw[kRowsPerBlock][32], sb[kRowsPerBlock][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t c0 = blockIdx.x * 32LL; c0 < C; c0 += static_cast<int64_t>(gridDim.x) * 32) {
    const int64_t c = c0 + lane;
    double aw = 0, ab = 0;
    if (c < C)
      for (int64_t i = warp; i < N; i += kRowsPerBlock) {
        const float d = dout[i * C + c];
        ab += d;
        aw += static_cast<double>((inp[i * C + c] - mean[i]) * rstd[i]) * d;
      }
    sw[warp][lane] = aw;
    sb[warp][lane] = ab;
    __syncthreads();
    if (warp == 0 && c < C) {
      double tw = 0, tb = 0;
      for (int k = 0; k < kRowsPerBlock; k++) {
        tw += sw[k][lane];
        tb += sb[k][lane];
      }
      dw[c] += static_cast<float>(tw);
      db[c] += static_cast<float>(tb);
    }
    __syncthreads();
  }
}

__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t N) {
  DTLAB_GRID_STRIDE(i, N) out[i] = 0.5f * inp[i] * (1.0f + erff(inp[i] * static_cast<float>(M_SQRT1_2)));
}

__global__ void gelu_backward_kernel(float* d, const float* dout, const float* inp, int64_t N) {
  const float kBeta = static_cast<float>(M_2_SQRTPI * M_SQRT1_2 * 0.5);  // 1/sqrt(2 pi)
  DTLAB_GRID_STRIDE(i, N) {
    const float x = inp[i];
    const float cdf = 0.5f * (1.0f + erff(x * static_cast<float>(M_SQRT1_2)));
    const float pdf = expf(-0.5f * x * x) * kBeta;
    d[i] = dout[i] * (cdf + x * pdf);
  }
}

// Rows of T scores (B NH T of them; row t of a head sees positions 0..t): the softmax in place,
// zeros above the diagonal.
__global__ void causal_softmax_kernel(float* att, int64_t rows, int64_t T) {
  const int lane = threadIdx.x % 32;
  DTLAB_WARP_ROWS(r, rows) {
    const int64_t t = r % T;
    float* row = att + r * T;
    float mx = -INFINITY;
    for (int64_t j = lane; j <= t; j += 32) mx = fmaxf(mx, row[j]);
    mx = warp_max(mx);
    double sum = 0;
    for (int64_t j = lane; j <= t; j += 32) {
      const float e = expf(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / warp_sum(sum));
    for (int64_t j = lane; j < T; j += 32) row[j] = j <= t ? row[j] * inv : 0.0f;
  }
}

// datt = att * (datt - rowsum(att * datt)) * scale on the causal part, zeros above.
__global__ void causal_softmax_backward_kernel(float* datt, const float* att, int64_t rows, int64_t T, float scale) {
  const int lane = threadIdx.x % 32;
  DTLAB_WARP_ROWS(r, rows) {
    const int64_t t = r % T;
    const float* a = att + r * T;
    float* d = datt + r * T;
    double dot = 0;
    for (int64_t j = lane; j <= t; j += 32) dot += static_cast<double>(a[j]) * d[j];
    const float s = static_cast<float>(warp_sum(dot));
    for (int64_t j = lane; j < T; j += 32) d[j] = j <= t ? a[j] * (d[j] - s) * scale : 0.0f;
  }
}

__global__ void embedding_forward_kernel(float* x, const float* wte, const float* wpe, const int64_t* idx, int64_t R,
                                         int64_t Tl, int64_t T, int64_t t0, int64_t C) {
  DTLAB_GRID_STRIDE(k, R * C) {
    const int64_t i = k / C, c = k % C, pos = t0 + i % Tl;
    x[k] = wte[idx[(i / Tl) * T + pos] * C + c] + wpe[pos * C + c];
  }
}

// One thread per column walks the rows in order, as the CPU's loop adds them (a token's rows meet in
// the same column of the same thread, so nothing races).
__global__ void embedding_backward_kernel(float* dwte, float* dwpe, const float* dx, const int64_t* idx, int64_t R,
                                          int64_t Tl, int64_t T, int64_t t0, int64_t C) {
  DTLAB_GRID_STRIDE(c, C) {
    for (int64_t i = 0; i < R; i++) {
      const int64_t pos = t0 + i % Tl;
      const float d = dx[i * C + c];
      dwte[idx[(i / Tl) * T + pos] * C + c] += d;
      dwpe[pos * C + c] += d;
    }
  }
}

__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  DTLAB_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void add_rows_kernel(float* y, const float* bias, int64_t R, int64_t C) {
  DTLAB_GRID_STRIDE(i, R * C) y[i] += bias[i % C];
}

}  // namespace

void launch_layernorm_forward(cudaStream_t s, float* out, float* mean, float* rstd, const float* inp, const float* w,
                              const float* b, int64_t N, int64_t C) {
  layernorm_forward_kernel<<<row_grid(N), kBlock, 0, s>>>(out, mean, rstd, inp, w, b, N, C);
}

void launch_layernorm_backward(cudaStream_t s, float* dinp, float* dw, float* db, const float* dout, const float* inp,
                               const float* w, const float* mean, const float* rstd, int64_t N, int64_t C) {
  if (dinp) layernorm_backward_input_kernel<<<row_grid(N), kBlock, 0, s>>>(dinp, dout, inp, w, mean, rstd, N, C);
  if (!dw) return;  // frozen weights (LoRA's base)
  const unsigned col_blocks = static_cast<unsigned>(std::clamp<int64_t>((C + 31) / 32, 1, 65535));
  layernorm_backward_params_kernel<<<col_blocks, kBlock, 0, s>>>(dw, db, dout, inp, mean, rstd, N, C);
}

void launch_gelu_forward(cudaStream_t s, float* out, const float* inp, int64_t N) {
  gelu_forward_kernel<<<grid_for(N), kBlock, 0, s>>>(out, inp, N);
}

void launch_gelu_backward(cudaStream_t s, float* d, const float* dout, const float* inp, int64_t N) {
  gelu_backward_kernel<<<grid_for(N), kBlock, 0, s>>>(d, dout, inp, N);
}

void launch_causal_softmax(cudaStream_t s, float* att, int64_t rows, int64_t T) {
  causal_softmax_kernel<<<row_grid(rows), kBlock, 0, s>>>(att, rows, T);
}

void launch_causal_softmax_backward(cudaStream_t s, float* datt, const float* att, int64_t rows, int64_t T, float scale) {
  causal_softmax_backward_kernel<<<row_grid(rows), kBlock, 0, s>>>(datt, att, rows, T, scale);
}

void launch_embedding_forward(cudaStream_t s, float* x, const float* wte, const float* wpe, const int64_t* idx, int64_t R,
                              int64_t Tl, int64_t T, int64_t t0, int64_t C) {
  embedding_forward_kernel<<<grid_for(R * C), kBlock, 0, s>>>(x, wte, wpe, idx, R, Tl, T, t0, C);
}

void launch_embedding_backward(cudaStream_t s, float* dwte, float* dwpe, const float* dx, const int64_t* idx, int64_t R,
                               int64_t Tl, int64_t T, int64_t t0, int64_t C) {
  embedding_backward_kernel<<<grid_for(C), kBlock, 0, s>>>(dwte, dwpe, dx, idx, R, Tl, T, t0, C);
}

void launch_add(cudaStream_t s, float* out, const float* a, const float* b, int64_t n) {
  add_kernel<<<grid_for(n), kBlock, 0, s>>>(out, a, b, n);
}

void launch_add_rows(cudaStream_t s, float* y, const float* bias, int64_t R, int64_t C) {
  add_rows_kernel<<<grid_for(R * C), kBlock, 0, s>>>(y, bias, R, C);
}

}  // namespace dtlab::cuda
