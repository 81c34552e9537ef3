// Launch geometry shared by the .cu files: a grid-stride loop over n elements, 256 threads a block,
// at most enough blocks to fill the GPU a few times over.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace dtlab::cuda {

constexpr int kBlock = 256;

inline unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kBlock - 1) / kBlock, 1, 65535));
}

#define DTLAB_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

}  // namespace dtlab::cuda
