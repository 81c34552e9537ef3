#include "engine/cuda/rank_device.h"

#include "engine/cuda/runtime.h"

namespace dtlab::cuda {

RankDevice::RankDevice(int rank, int device) : rank_(rank), device_(device) {
  bind();
  DTLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  DTLAB_CUDA_CHECK(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
  if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS)
    fail_library(__FILE__, __LINE__, "cublasCreate", cublas_load_error().empty() ? "could not create a cuBLAS handle" : cublas_load_error());
  cublasSetStream(blas_, compute_);
  // Plain FP32 GEMMs (no TF32): the parity tests compare against the CPU engine at 1e-5.
  cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH);
}

RankDevice::~RankDevice() {
  cudaSetDevice(device_);
  if (blas_) cublasDestroy(blas_);
  if (compute_) cudaStreamDestroy(compute_);
  if (comm_) cudaStreamDestroy(comm_);
}

void RankDevice::bind() const { DTLAB_CUDA_CHECK(cudaSetDevice(device_)); }

void RankDevice::sync_compute() const { DTLAB_CUDA_CHECK(cudaStreamSynchronize(compute_)); }

}  // namespace dtlab::cuda
