// The CUDA runtime layer: how many GPUs this process sees, a check that never crashes without a
// driver or a GPU (cudaGetDeviceCount then returns an error code, which becomes the reason), each
// device's own free/total memory, and the check macros every CUDA file uses (file:line, the call,
// and the CUDA error's name and sentence).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/check.h"

namespace dtlab::cuda {

// A failed CUDA, cuBLAS or NCCL call: "CUDA error at engine/cuda/ops.cpp:42: cudaMalloc(...):
// cudaErrorMemoryAllocation (out of memory)".
struct CudaError : Error {
  using Error::Error;
};

int device_count();       // 0 when there is no driver or no device
bool cuda_available();    // device_count() > 0, decided once per process
// Why cuda_available() is false: "no CUDA device (cudaGetDeviceCount: CUDA driver version is
// insufficient for CUDA runtime version)"; empty when a device is present.
std::string unavailable_reason();

struct DeviceInfo {
  int index = 0;
  std::string name;          // "NVIDIA H200"
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  int64_t total_bytes = 0;
};
DeviceInfo device_info(int device);

// The device's own figure (cudaMemGetInfo), beside what the memory trackers count: it includes the
// CUDA context, cuBLAS workspaces and other processes.
struct DeviceMemory {
  int64_t free_bytes = 0, total_bytes = 0;
};
DeviceMemory device_memory(int device);

// "CUDA runtime 13.0, driver 13.0; device 0: NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)" or the reason.
std::string runtime_summary();

// Readies the devices' default memory pools, where every Tensor on a GPU comes from: freed memory
// stays in the pool (no return to the driver at each synchronization), and each device's pool is
// readable and writable by the others of `devices` with peer access enabled (the cuda backend's
// copies and NCCL's direct peer path read other ranks' buffers). `peers_required`: throw a sentence
// when two devices cannot reach each other (the cuda backend needs it; NCCL routes around it).
void prepare_pools(const std::vector<int>& devices, bool peers_required);

[[noreturn]] void fail_cuda(const char* file, int line, const char* call, cudaError_t e);
[[noreturn]] void fail_library(const char* file, int line, const char* call, const std::string& what);

}  // namespace dtlab::cuda

#define DTLAB_CUDA_CHECK(call)                                                   \
  do {                                                                           \
    cudaError_t dtlab_e_ = (call);                                               \
    if (dtlab_e_ != cudaSuccess) ::dtlab::cuda::fail_cuda(__FILE__, __LINE__, #call, dtlab_e_); \
  } while (0)

// After a kernel launch: a launch error (bad configuration, no kernel image for this GPU) as a sentence.
#define DTLAB_CUDA_CHECK_LAUNCH()                                                              \
  do {                                                                                         \
    cudaError_t dtlab_e_ = cudaGetLastError();                                                 \
    if (dtlab_e_ != cudaSuccess) ::dtlab::cuda::fail_cuda(__FILE__, __LINE__, "kernel launch", dtlab_e_); \
  } while (0)
