// One optimizer step's arithmetic, shared by the CPU loops (optim.cpp) and the CUDA kernels
// (engine/cuda/optim_kernels.cu), so both round where torch's ops round: the scalars are computed in
// double from the config and rounded to float where a tensor op consumes them (sgd_coeffs and
// adamw_coeffs in optim.h), and each element update mirrors torch's _single_tensor_sgd/_adamw line
// by line. Plain header: nvcc compiles it without the rest of the engine.
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define DTLAB_HOST_DEVICE __host__ __device__
#else
#define DTLAB_HOST_DEVICE
#endif

namespace dtlab {

struct SgdCoeffs {
  float lr, weight_decay, momentum;
  float one_minus_dampening;
};

struct AdamWCoeffs {
  float decay;                   // 1 - lr * weight_decay
  float b1, b2, one_b1, one_b2;  // betas and 1 - betas
  float neg_step_size;           // -lr / (1 - beta1^t)
  float bc2_sqrt;                // sqrt(1 - beta2^t)
  float eps;
};

// `buf`: this element's momentum buffer, null without momentum; `first`: the buffer starts as d_p.
DTLAB_HOST_DEVICE inline void sgd_update(float& p, float g, float* buf, bool first, const SgdCoeffs& k) {
  float d = g;
  if (k.weight_decay != 0.0f) d = d + k.weight_decay * p;  // d_p = d_p.add(param, alpha=weight_decay)
  if (buf) {
    if (first) *buf = d;                                 // buf = clone(d_p)
    else *buf = *buf * k.momentum + k.one_minus_dampening * d;  // buf.mul_(momentum).add_(d_p, alpha=1-dampening)
    d = *buf;
  }
  p = p + (-k.lr) * d;                                   // param.add_(d_p, alpha=-lr)
}

DTLAB_HOST_DEVICE inline void adamw_update(float& p, float g, float& m, float& v, const AdamWCoeffs& k) {
  p = p * k.decay;                           // param.mul_(1 - lr * weight_decay)
  m = m * k.b1 + k.one_b1 * g;               // exp_avg.mul_(beta1).add_(grad, alpha=1-beta1)
  v = v * k.b2 + k.one_b2 * g * g;           // exp_avg_sq.mul_(beta2).addcmul_(g, g, 1-beta2)
  float denom = sqrtf(v) / k.bc2_sqrt + k.eps;  // (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
  p = p + k.neg_step_size * m / denom;       // param.addcdiv_(exp_avg, denom, -step_size)
}

}  // namespace dtlab
