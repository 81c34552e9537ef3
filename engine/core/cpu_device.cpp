// The CPU implementation of the device interface (engine/core/device.h): host memory, the GEMMs of
// ops.cpp (OpenBLAS) and the loops of ops.cpp and optim_math.h. Stateless, so one instance serves
// every rank; the host clock is its clock, so it has no timer (ops report to the rank's context).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/gpt_ops.h"
#include "engine/core/ops.h"

namespace dtlab {

namespace {

class CpuDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::CPU; }
  std::string name() const override { return "cpu"; }

  void* allocate(int64_t bytes) override {
    // 64-byte alignment: whole cache lines, and AVX-512 loads never straddle them.
    const size_t padded = (static_cast<size_t>(bytes) + 63) & ~size_t(63);
    void* p = std::aligned_alloc(64, padded);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, padded);
    return p;
  }
  void release(void* p) override { std::free(p); }
  void fill_zero(void* p, int64_t bytes) override {
    if (bytes > 0) std::memset(p, 0, static_cast<size_t>(bytes));
  }
  void copy(void* dst, const void* src, int64_t bytes) override {
    if (bytes > 0 && dst != src) std::memmove(dst, src, static_cast<size_t>(bytes));
  }
  void upload(void* dst, const void* src, int64_t bytes) override { copy(dst, src, bytes); }
  void download(void* dst, const void* src, int64_t bytes) override { copy(dst, src, bytes); }

  void widen_half(float* dst, const uint16_t* src, int64_t n, HalfFormat f) override { half_to_floats(dst, src, n, f); }
  void narrow_half(uint16_t* dst, const float* src, int64_t n, HalfFormat f) override { half_from_floats(dst, src, n, f); }
  void round_half(float* x, int64_t n, HalfFormat f) override {
    for (int64_t i = 0; i < n; i++) x[i] = round_to_half(x[i], f);
  }
  void accumulate_half(uint16_t* acc, const uint16_t* x, int64_t n, bool max, HalfFormat f) override {
    for (int64_t i = 0; i < n; i++) {  // as engine/comm/reduce_kernels.h's reduce_half
      const float a = half_to_float(acc[i], f), b = half_to_float(x[i], f);
      acc[i] = half_from_float(max ? std::max(a, b) : a + b, f);
    }
  }
  bool half_all_finite(const uint16_t* x, int64_t n, HalfFormat f) override { return dtlab::half_all_finite(x, n, f); }
  bool all_finite(const float* x, int64_t n) override {
    for (int64_t i = 0; i < n; i++)
      if (!std::isfinite(x[i])) return false;
    return true;
  }

  void scale(float* x, int64_t n, float s) override {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
  }
  void scale_copy(float* dst, const float* src, int64_t n, float s) override {
    for (int64_t i = 0; i < n; i++) dst[i] = src[i] * s;
  }
  void accumulate(float* acc, const float* x, int64_t n, bool max) override {
    if (max) {
      for (int64_t i = 0; i < n; i++) acc[i] = std::max(acc[i], x[i]);
    } else {
      for (int64_t i = 0; i < n; i++) acc[i] += x[i];
    }
  }

  void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t B, int64_t C,
                      int64_t OC) override {
    dtlab::linear_forward(out, inp, weight, bias, B, C, OC);
  }
  void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int64_t B, int64_t C, int64_t OC) override {
    dtlab::linear_backward(dinp, dweight, dbias, dout, inp, weight, B, C, OC);
  }
  void relu_forward(float* out, const float* inp, int64_t N) override { dtlab::relu_forward(out, inp, N); }
  void relu_backward(float* dinp, const float* dout, const float* out, int64_t N) override {
    dtlab::relu_backward(dinp, dout, out, N);
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b, int64_t N,
                         int64_t C) override {
    dtlab::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                          const float* mean, const float* rstd, int64_t N, int64_t C) override {
    dtlab::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void gelu_forward(float* out, const float* inp, int64_t N) override { dtlab::gelu_forward(out, inp, N); }
  void gelu_backward(float* d, const float* dout, const float* inp, int64_t N) override { dtlab::gelu_backward(d, dout, inp, N); }
  void attention_forward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                         const HalfFormat* round16) override {
    dtlab::attention_forward(out, att, qkv, B, T, C, NH, round16);
  }
  void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att, int64_t B, int64_t T,
                          int64_t C, int64_t NH, const HalfFormat* round16) override {
    dtlab::attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH, round16);
  }
  void embedding_forward(float* x, const float* wte, const float* wpe, const int64_t* idx, int64_t R, int64_t Tl, int64_t T,
                         int64_t t0, int64_t C) override {
    dtlab::embedding_forward(x, wte, wpe, idx, R, Tl, T, t0, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dx, const int64_t* idx, int64_t R, int64_t Tl, int64_t T,
                          int64_t t0, int64_t C) override {
    dtlab::embedding_backward(dwte, dwpe, dx, idx, R, Tl, T, t0, C);
  }
  void add(float* out, const float* a, const float* b, int64_t n) override {
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
  }
  void add_rows(float* y, const float* bias, int64_t R, int64_t C) override {
    for (int64_t i = 0; i < R; i++)
      for (int64_t c = 0; c < C; c++) y[i * C + c] += bias[c];
  }
  void sum_rows(float* acc, const float* x, int64_t R, int64_t C) override {
    for (int64_t i = 0; i < R; i++)
      for (int64_t c = 0; c < C; c++) acc[c] += x[i * C + c];
  }

  void cross_entropy_forward(float* probs, double* stats, const float* logits, const int64_t* targets, int64_t B,
                             int64_t C) override {
    stats[0] += static_cast<double>(dtlab::cross_entropy_forward(probs, logits, targets, B, C)) * static_cast<double>(B);
    stats[1] += static_cast<double>(count_correct(logits, targets, B, C));
  }
  void cross_entropy_backward(float* dlogits, const float* probs, const int64_t* targets, int64_t B, int64_t C,
                              float scale) override {
    dtlab::cross_entropy_backward(dlogits, probs, targets, B, C, scale);
  }

  void sgd_step(float* p, const float* g, float* buf, int64_t n, SgdCoeffs k, bool first) override {
    for (int64_t i = 0; i < n; i++) sgd_update(p[i], g[i], buf ? buf + i : nullptr, first, k);
  }
  void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, AdamWCoeffs k) override {
    for (int64_t i = 0; i < n; i++) adamw_update(p[i], g[i], m[i], v[i], k);
  }
};

}  // namespace

Device& cpu_device() {
  static CpuDevice dev;
  return dev;
}

void upload_half(Device& dev, uint16_t* dst, const float* host, int64_t n, HalfFormat f) {
  if (dev.is_host()) return half_from_floats(dst, host, n, f);
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  half_from_floats(bits.data(), host, n, f);
  dev.upload(dst, bits.data(), n * static_cast<int64_t>(sizeof(uint16_t)));
}

void download_half(const Device& dev, float* host, const uint16_t* src, int64_t n, HalfFormat f) {
  if (dev.is_host()) return half_to_floats(host, src, n, f);
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  const_cast<Device&>(dev).download(bits.data(), src, n * static_cast<int64_t>(sizeof(uint16_t)));
  half_to_floats(host, bits.data(), n, f);
}

}  // namespace dtlab
