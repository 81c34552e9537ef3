// One rank's place on a GPU: its device, a compute stream (layers, loss, optimizer), a comm stream
// (the collectives' copies and reductions) and a cuBLAS handle bound to the compute stream. Several
// ranks may share one device; each still owns its streams, so their work interleaves on the GPU the
// way separate processes' work would. Streams are non-blocking: they never wait on the legacy
// default stream, so one rank's synchronization never stalls another's.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

namespace dtlab::cuda {

// Empty once cuBLAS is loaded (engine/cuda/cublas_loader.cpp loads it on first use), else why not.
std::string cublas_load_error();

class RankDevice {
 public:
  RankDevice(int rank, int device);
  ~RankDevice();
  RankDevice(const RankDevice&) = delete;
  RankDevice& operator=(const RankDevice&) = delete;

  int rank() const { return rank_; }
  int device() const { return device_; }
  cudaStream_t compute() const { return compute_; }
  cudaStream_t comm() const { return comm_; }
  cublasHandle_t blas() const { return blas_; }
  // The current device is per host thread: every thread that works for this rank calls this first.
  void bind() const;
  void sync_compute() const;  // host waits for the compute stream

 private:
  int rank_, device_;
  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  cublasHandle_t blas_ = nullptr;
};

}  // namespace dtlab::cuda
