// Optimizer kernels: one thread per parameter running optim_math.h's element update, the same
// function optim.cpp's loops run. Built with --fmad=false (CMakeLists.txt) so no multiply-add is
// fused and each float rounding happens where the CPU's (and torch's) does.
#include "engine/cuda/kernels.h"
#include "engine/cuda/launch.cuh"

namespace dtlab::cuda {

namespace {

__global__ void sgd_kernel(float* p, const float* g, float* buf, int64_t n, SgdCoeffs k, bool first) {
  DTLAB_GRID_STRIDE(i, n) sgd_update(p[i], g[i], buf ? buf + i : nullptr, first, k);
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, AdamWCoeffs k) {
  DTLAB_GRID_STRIDE(i, n) adamw_update(p[i], g[i], m[i], v[i], k);
}

}  // namespace

void launch_sgd_step(cudaStream_t s, float* params, const float* grads, float* buf, int64_t n,
                     SgdCoeffs k, bool first) {
  if (n > 0) sgd_kernel<<<grid_for(n), kBlock, 0, s>>>(params, grads, buf, n, k, first);
}

void launch_adamw_step(cudaStream_t s, float* params, const float* grads, float* m, float* v,
                       int64_t n, AdamWCoeffs k) {
  if (n > 0) adamw_kernel<<<grid_for(n), kBlock, 0, s>>>(params, grads, m, v, n, k);
}

}  // namespace dtlab::cuda
