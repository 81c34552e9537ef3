#include "engine/core/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/core/check.h"

extern "C" {
// OpenBLAS extensions (declared in its cblas.h, but not in every cblas.h the alternatives may pick).
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
}

namespace dtlab {

void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int64_t B, int64_t C, int64_t OC) {
  // Seed each output row with the bias, then let one GEMM accumulate on top (beta = 1):
  // no second pass over `out` for the bias.
  if (bias) {
    for (int64_t b = 0; b < B; b++) std::memcpy(out + b * OC, bias, sizeof(float) * OC);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)B, (int)OC, (int)C, 1.0f, inp, (int)C,
              weight, (int)C, bias ? 1.0f : 0.0f, out, (int)OC);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t B, int64_t C, int64_t OC) {
  if (dinp) {  // (B, C) = (B, OC) @ (OC, C)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)B, (int)C, (int)OC, 1.0f, dout,
                (int)OC, weight, (int)C, 0.0f, dinp, (int)C);
  }
  if (dweight) {  // (OC, C) += (OC, B) @ (B, C)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)B, 1.0f, dout,
                (int)OC, inp, (int)C, 1.0f, dweight, (int)C);
  }
  if (dbias) {
    for (int64_t b = 0; b < B; b++) {
      const float* row = dout + b * OC;
      for (int64_t o = 0; o < OC; o++) dbias[o] += row[o];
    }
  }
}

// torch's rules exactly: relu is clamp_min(x, 0), so NaN propagates and -0.0 stays -0.0; its
// backward is threshold_backward, `out <= 0 ? 0 : grad`, so a NaN output passes the gradient on.
void relu_forward(float* out, const float* inp, int64_t N) {
  for (int64_t i = 0; i < N; i++) out[i] = inp[i] < 0.0f ? 0.0f : inp[i];
}

void relu_backward(float* dinp, const float* dout, const float* out, int64_t N) {
  for (int64_t i = 0; i < N; i++) dinp[i] = out[i] <= 0.0f ? 0.0f : dout[i];
}

float cross_entropy_forward(float* probs, const float* logits, const int64_t* targets,
                            int64_t B, int64_t C) {
  double total = 0.0;
  for (int64_t b = 0; b < B; b++) {
    const float* z = logits + b * C;
    float* p = probs + b * C;
    int64_t t = targets[b];
    DTLAB_CHECK(t >= 0 && t < C, "target class out of range for the model's output width");
    float maxv = z[0];
    for (int64_t c = 1; c < C; c++) maxv = std::max(maxv, z[c]);
    float sum = 0.0f;
    for (int64_t c = 0; c < C; c++) {
      p[c] = std::exp(z[c] - maxv);
      sum += p[c];
    }
    float inv = 1.0f / sum;
    for (int64_t c = 0; c < C; c++) p[c] *= inv;
    // -log softmax_t = logsumexp(z) - z_t, computed from the shifted sum (no log of a tiny prob).
    total += static_cast<double>(std::log(sum) + maxv - z[t]);
  }
  return B > 0 ? static_cast<float>(total / static_cast<double>(B)) : 0.0f;
}

void cross_entropy_backward(float* dlogits, const float* probs, const int64_t* targets,
                            int64_t B, int64_t C, float scale) {
  for (int64_t b = 0; b < B; b++) {
    const float* p = probs + b * C;
    float* d = dlogits + b * C;
    for (int64_t c = 0; c < C; c++) d[c] = p[c] * scale;
    d[targets[b]] -= scale;
  }
}

int64_t count_correct(const float* logits, const int64_t* targets, int64_t B, int64_t C) {
  int64_t correct = 0;
  for (int64_t b = 0; b < B; b++) {
    const float* z = logits + b * C;
    int64_t best = 0;
    for (int64_t c = 1; c < C; c++)
      if (z[c] > z[best]) best = c;
    correct += best == targets[b];
  }
  return correct;
}

void set_compute_threads(int n) {
  // The library's own choice, read before the first change, so that 0 can restore it.
  static const int library_default = openblas_get_num_threads();
  openblas_set_num_threads(n > 0 ? n : library_default);
}

int compute_threads() { return openblas_get_num_threads(); }

}  // namespace dtlab
