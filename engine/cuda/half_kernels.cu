// 16-bit tensors on the GPU (--precision bf16/fp16): engine/core/half.h's conversions, compiled for the
// device from the same definitions, so a GPU's bf16/fp16 bits equal the CPU engine's; and the 16-bit
// reduction of the cuda backend's collectives (reduce_kernels.h's reduce_half: each sum in float,
// rounded once, as NCCL's per-step bf16/fp16 sums).
#include "engine/core/half.h"
#include "engine/cuda/kernels.h"
#include "engine/cuda/launch.cuh"

namespace dtlab::cuda {

namespace {

__global__ void widen_kernel(float* dst, const uint16_t* src, int64_t n, HalfFormat f) {
  DTLAB_GRID_STRIDE(i, n) dst[i] = half_to_float(src[i], f);
}

__global__ void narrow_kernel(uint16_t* dst, const float* src, int64_t n, HalfFormat f) {
  DTLAB_GRID_STRIDE(i, n) dst[i] = half_from_float(src[i], f);
}

__global__ void round_kernel(float* x, int64_t n, HalfFormat f) {
  DTLAB_GRID_STRIDE(i, n) x[i] = round_to_half(x[i], f);
}

// Any element whose exponent is all ones (inf or NaN) sets *bad.
__global__ void nonfinite_kernel(int64_t* bad, const uint16_t* x, int64_t n, HalfFormat f) {
  DTLAB_GRID_STRIDE(i, n) if (!half_is_finite(x[i], f)) *bad = 1;
}

__global__ void nonfinite_f32_kernel(int64_t* bad, const float* x, int64_t n) {
  DTLAB_GRID_STRIDE(i, n) if (!isfinite(x[i])) *bad = 1;
}

__global__ void reduce_half_kernel(uint16_t* dst, const uint16_t* a, const uint16_t* b, int64_t n, bool max, HalfFormat f) {
  DTLAB_GRID_STRIDE(i, n) {
    const float x = half_to_float(a[i], f), y = half_to_float(b[i], f);
    dst[i] = half_from_float(max ? (x < y ? y : x) : x + y, f);
  }
}

}  // namespace

void launch_widen_half(cudaStream_t s, float* dst, const uint16_t* src, int64_t n, HalfFormat f) {
  if (n > 0) widen_kernel<<<grid_for(n), kBlock, 0, s>>>(dst, src, n, f);
}

void launch_narrow_half(cudaStream_t s, uint16_t* dst, const float* src, int64_t n, HalfFormat f) {
  if (n > 0) narrow_kernel<<<grid_for(n), kBlock, 0, s>>>(dst, src, n, f);
}

void launch_round_half(cudaStream_t s, float* x, int64_t n, HalfFormat f) {
  if (n > 0) round_kernel<<<grid_for(n), kBlock, 0, s>>>(x, n, f);
}

void launch_half_nonfinite(cudaStream_t s, int64_t* bad, const uint16_t* x, int64_t n, HalfFormat f) {
  if (n > 0) nonfinite_kernel<<<grid_for(n), kBlock, 0, s>>>(bad, x, n, f);
}

void launch_nonfinite(cudaStream_t s, int64_t* bad, const float* x, int64_t n) {
  if (n > 0) nonfinite_f32_kernel<<<grid_for(n), kBlock, 0, s>>>(bad, x, n);
}

void launch_reduce_half(cudaStream_t s, uint16_t* dst, const uint16_t* a, const uint16_t* b, int64_t n, bool max, HalfFormat f) {
  if (n > 0) reduce_half_kernel<<<grid_for(n), kBlock, 0, s>>>(dst, a, b, n, max, f);
}

}  // namespace dtlab::cuda
