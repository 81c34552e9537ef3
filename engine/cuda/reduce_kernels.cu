// The reduction kernel of the cuda backend's collectives: dst = a op b, element-wise, the device
// form of engine/comm/reduce_kernels.h (one addition per element, so results equal the CPU's).
#include "engine/cuda/kernels.h"
#include "engine/cuda/launch.cuh"

namespace dtlab::cuda {

namespace {

template <class T>
__global__ void reduce_kernel(T* dst, const T* a, const T* b, int64_t n, bool max) {
  DTLAB_GRID_STRIDE(i, n) {
    const T x = a[i], y = b[i];
    dst[i] = max ? (x < y ? y : x) : x + y;
  }
}

__global__ void scale_kernel(float* buf, float factor, int64_t n) {
  DTLAB_GRID_STRIDE(i, n) buf[i] *= factor;
}

__global__ void scale_copy_kernel(float* dst, const float* src, float factor, int64_t n) {
  DTLAB_GRID_STRIDE(i, n) dst[i] = src[i] * factor;
}

}  // namespace

void launch_reduce_f32(cudaStream_t s, float* dst, const float* a, const float* b, int64_t n, bool max) {
  if (n > 0) reduce_kernel<float><<<grid_for(n), kBlock, 0, s>>>(dst, a, b, n, max);
}

void launch_reduce_i64(cudaStream_t s, int64_t* dst, const int64_t* a, const int64_t* b, int64_t n, bool max) {
  if (n > 0) reduce_kernel<int64_t><<<grid_for(n), kBlock, 0, s>>>(dst, a, b, n, max);
}

void launch_scale(cudaStream_t s, float* buf, float factor, int64_t n) {
  if (n > 0) scale_kernel<<<grid_for(n), kBlock, 0, s>>>(buf, factor, n);
}

void launch_scale_copy(cudaStream_t s, float* dst, const float* src, float factor, int64_t n) {
  if (n > 0) scale_copy_kernel<<<grid_for(n), kBlock, 0, s>>>(dst, src, factor, n);
}

}  // namespace dtlab::cuda
