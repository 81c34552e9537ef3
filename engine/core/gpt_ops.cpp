#include "engine/core/gpt_ops.h"

#include <algorithm>
#include <cmath>

#include <cblas.h>

#include "engine/core/vec_math.h"

namespace dtlab {

// F.layer_norm over the last dimension: out = (x - mean) * rstd * w + b, the biased variance.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                       int64_t N, int64_t C) {
  for (int64_t i = 0; i < N; i++) {
    const float* x = inp + i * C;
    double m = 0;
    for (int64_t c = 0; c < C; c++) m += x[c];
    m /= static_cast<double>(C);
    double v = 0;
    for (int64_t c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= static_cast<double>(C);
    const float s = static_cast<float>(1.0 / std::sqrt(v + kLayerNormEps));
    const float mf = static_cast<float>(m);
    float* o = out + i * C;
    for (int64_t c = 0; c < C; c++) o[c] = (x[c] - mf) * s * w[c] + b[c];
    mean[i] = mf;
    rstd[i] = s;
  }
}

// dinp += the input gradient; dw, db += the parameters'.
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                        const float* mean, const float* rstd, int64_t N, int64_t C) {
  for (int64_t i = 0; i < N; i++) {
    const float* dy = dout + i * C;
    const float* x = inp + i * C;
    const float m = mean[i], s = rstd[i];
    double dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t c = 0; c < C; c++) {
      const float norm = (x[c] - m) * s;
      const float dnorm = w[c] * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += static_cast<double>(dnorm) * norm;
    }
    const float a = static_cast<float>(dnorm_mean / static_cast<double>(C));
    const float bb = static_cast<float>(dnorm_norm_mean / static_cast<double>(C));
    float* dx = dinp + i * C;
    if (dw) {
      for (int64_t c = 0; c < C; c++) {
        const float norm = (x[c] - m) * s;
        const float dnorm = w[c] * dy[c];
        db[c] += dy[c];
        dw[c] += norm * dy[c];
        dx[c] += (dnorm - a - norm * bb) * s;
      }
    } else {  // frozen weights (LoRA's base): the input's gradient alone
      for (int64_t c = 0; c < C; c++) {
        const float norm = (x[c] - m) * s;
        dx[c] += (w[c] * dy[c] - a - norm * bb) * s;
      }
    }
  }
}

// nn.GELU() (approximate='none'): x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)).
void gelu_forward(float* out, const float* inp, int64_t N) {
  for (int64_t i = 0; i < N; i++) out[i] = 0.5f * inp[i] * (1.0f + erf_vec(inp[i] * static_cast<float>(M_SQRT1_2)));
}

// d = dout * (Phi(x) + x * phi(x)), in place on dout's buffer (d may equal dout).
void gelu_backward(float* d, const float* dout, const float* inp, int64_t N) {
  const float kBeta = static_cast<float>(M_2_SQRTPI * M_SQRT1_2 * 0.5);  // 1/sqrt(2 pi)
  for (int64_t i = 0; i < N; i++) {
    const float x = inp[i];
    const float cdf = 0.5f * (1.0f + erf_vec(x * static_cast<float>(M_SQRT1_2)));
    const float pdf = exp_vec(-0.5f * x * x) * kBeta;
    d[i] = dout[i] * (cdf + x * pdf);
  }
}

// Causal self-attention on the fused qkv (BT, 3C): q, k, v split at C and 2C, heads of hs columns;
// att (B, NH, T, T) keeps the softmax (zeros above the diagonal); out (BT, C) the heads side by side.
// Per (sample, head) two GEMMs read the heads in place (leading dimension 3C), as torch's batched
// matmuls do: scores = q k^T, then y = att v; the mask and softmax run on the rows in between.
void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                       const HalfFormat* round16) {
  const int64_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < NH; h++) {
      const float* q = qkv + b * T * C3 + h * hs;
      float* a = att + (b * NH + h) * T * T;
      // (Autocast: q k^T rounded, then times the scale, rounded again: nanoGPT's two ops.)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)hs, round16 ? 1.0f : scale, q, (int)C3, q + C,
                  (int)C3, 0.0f, a, (int)T);
      for (int64_t t = 0; t < T; t++) {
        float* row = a + t * T;
        if (round16)
          for (int64_t t2 = 0; t2 <= t; t2++) row[t2] = round_to_half(round_to_half(row[t2], *round16) * scale, *round16);
        float maxv = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; t2++) maxv = std::max(maxv, row[t2]);
        for (int64_t t2 = 0; t2 <= t; t2++) row[t2] = exp_vec(row[t2] - maxv);  // vectorized
        double sum = 0;  // in order, in double (a float reduction would not vectorize without reassociating)
        for (int64_t t2 = 0; t2 <= t; t2++) sum += row[t2];
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t t2 = 0; t2 <= t; t2++) row[t2] *= inv;
        if (round16)  // the softmax's 16-bit output, which att v reads
          for (int64_t t2 = 0; t2 <= t; t2++) row[t2] = round_to_half(row[t2], *round16);
        for (int64_t t2 = t + 1; t2 < T; t2++) row[t2] = 0;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)hs, (int)T, 1.0f, a, (int)T, q + 2 * C, (int)C3, 0.0f,
                  out + b * T * C + h * hs, (int)C);
    }
}

// dqkv (overwritten) from dout (BT, C); datt: T x T floats of scratch. With y = att v and
// att = softmax(scale q k^T): dv = att^T dy, datt = dy v^T, dpre = att (datt - rowsum(att datt)),
// dq = scale dpre k, dk = scale dpre^T q.
void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int64_t B,
                        int64_t T, int64_t C, int64_t NH, const HalfFormat* round16) {
  const int64_t hs = C / NH, C3 = 3 * C;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < NH; h++) {
      const float* q = qkv + b * T * C3 + h * hs;
      const float* a = att + (b * NH + h) * T * T;
      const float* dy = dout + b * T * C + h * hs;
      float* dq = dqkv + b * T * C3 + h * hs;
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)hs, (int)T, 1.0f, a, (int)T, dy, (int)C, 0.0f, dq + 2 * C,
                  (int)C3);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)hs, 1.0f, dy, (int)C, q + 2 * C, (int)C3, 0.0f, datt,
                  (int)T);
      for (int64_t t = 0; t < T; t++) {
        const float* ar = a + t * T;
        float* dr = datt + t * T;
        if (round16)  // dy v^T, a 16-bit matmul's output
          for (int64_t t2 = 0; t2 <= t; t2++) dr[t2] = round_to_half(dr[t2], *round16);
        double dot = 0;
        for (int64_t t2 = 0; t2 <= t; t2++) dot += static_cast<double>(ar[t2]) * dr[t2];
        const float s = static_cast<float>(dot);
        if (round16)  // the softmax's backward, then the scaling's, each rounded
          for (int64_t t2 = 0; t2 <= t; t2++) dr[t2] = round_to_half(round_to_half(ar[t2] * (dr[t2] - s), *round16) * scale, *round16);
        else
          for (int64_t t2 = 0; t2 <= t; t2++) dr[t2] = ar[t2] * (dr[t2] - s) * scale;
        for (int64_t t2 = t + 1; t2 < T; t2++) dr[t2] = 0;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)hs, (int)T, 1.0f, datt, (int)T, q + C, (int)C3, 0.0f, dq,
                  (int)C3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)hs, (int)T, 1.0f, datt, (int)T, q, (int)C3, 0.0f, dq + C,
                  (int)C3);
    }
}

void embedding_forward(float* x, const float* wte, const float* wpe, const int64_t* idx, int64_t R, int64_t Tl, int64_t T,
                       int64_t t0, int64_t C) {
  for (int64_t i = 0; i < R; i++) {
    const int64_t pos = t0 + i % Tl;
    const float* te = wte + idx[(i / Tl) * T + pos] * C;
    const float* pe = wpe + pos * C;
    for (int64_t c = 0; c < C; c++) x[i * C + c] = te[c] + pe[c];
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dx, const int64_t* idx, int64_t R, int64_t Tl, int64_t T,
                        int64_t t0, int64_t C) {
  for (int64_t i = 0; i < R; i++) {
    const int64_t pos = t0 + i % Tl;
    float* te = dwte + idx[(i / Tl) * T + pos] * C;
    float* pe = dwpe + pos * C;
    const float* d = dx + i * C;
    for (int64_t c = 0; c < C; c++) {
      te[c] += d[c];
      pe[c] += d[c];
    }
  }
}

}  // namespace dtlab
