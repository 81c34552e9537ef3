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

// One element of a fused ring step: the peer's value y reduced into (or copied over) x, then scaled
// (Avg's last reduce-scatter step; 1 otherwise). Two roundings, the sum's and the product's, as
// reduce_kernel followed by scale_kernel give (the .cu files build with --fmad=false).
__device__ __forceinline__ float reduce_copy_one(float x, float y, bool reduce, bool max, float scale) {
  float v = reduce ? (max ? (x < y ? y : x) : x + y) : y;
  if (scale != 1.0f) v *= scale;
  return v;
}

// dst[i] = reduce_copy_one(dst[i], src[i]) for i in [0, n): 16-byte loads and stores over the body
// [head, head + 4 n4), where both pointers are 16-byte aligned, and single elements for the head and
// the tail (all of it when the two pointers are misaligned differently: head = n4 = 0).
__global__ void reduce_copy_f32_kernel(float* dst, const float* src, int64_t head, int64_t n4, int64_t n, bool reduce,
                                       bool max, float scale) {
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float4* d4 = reinterpret_cast<float4*>(dst + head);
  const float4* s4 = reinterpret_cast<const float4*>(src + head);
  for (int64_t i = tid; i < n4; i += stride) {
    const float4 y = s4[i];
    const float4 x = reduce ? d4[i] : y;
    d4[i] = make_float4(reduce_copy_one(x.x, y.x, reduce, max, scale), reduce_copy_one(x.y, y.y, reduce, max, scale),
                        reduce_copy_one(x.z, y.z, reduce, max, scale), reduce_copy_one(x.w, y.w, reduce, max, scale));
  }
  for (int64_t i = tid; i < head; i += stride) dst[i] = reduce_copy_one(dst[i], src[i], reduce, max, scale);
  for (int64_t i = head + 4 * n4 + tid; i < n; i += stride) dst[i] = reduce_copy_one(dst[i], src[i], reduce, max, scale);
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

void launch_reduce_copy_f32(cudaStream_t s, float* dst, const float* src, int64_t n, bool reduce, bool max, float scale) {
  if (n <= 0) return;
  const auto addr = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
  int64_t head = 0, n4 = 0;
  if (addr(dst) % 16 == addr(src) % 16) {  // equal offsets into equally aligned buffers: the ring's case
    head = std::min<int64_t>(n, static_cast<int64_t>((16 - addr(dst) % 16) % 16 / sizeof(float)));
    n4 = (n - head) / 4;
  }
  reduce_copy_f32_kernel<<<grid_for(n4 > 0 ? n4 : n), kBlock, 0, s>>>(dst, src, head, n4, n, reduce, max, scale);
}

void launch_scale(cudaStream_t s, float* buf, float factor, int64_t n) {
  if (n > 0) scale_kernel<<<grid_for(n), kBlock, 0, s>>>(buf, factor, n);
}

void launch_scale_copy(cudaStream_t s, float* dst, const float* src, float factor, int64_t n) {
  if (n > 0) scale_copy_kernel<<<grid_for(n), kBlock, 0, s>>>(dst, src, factor, n);
}

}  // namespace dtlab::cuda
