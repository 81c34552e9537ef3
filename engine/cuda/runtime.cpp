#include "engine/cuda/runtime.h"

#include <cstdio>

#include "engine/core/format.h"

namespace dtlab::cuda {

namespace {

struct Probe {
  int count = 0;
  std::string reason;
};

const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess) {
      r.count = 0;
      r.reason = std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
      cudaGetLastError();  // leave no sticky error behind for the next call
    } else if (r.count == 0) {
      r.reason = "no CUDA device";
    }
    return r;
  }();
  return p;
}

}  // namespace

int device_count() { return probe().count; }
bool cuda_available() { return probe().count > 0; }
std::string unavailable_reason() { return probe().reason; }

DeviceInfo device_info(int device) {
  cudaDeviceProp p{};
  DTLAB_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return {device, p.name, p.major, p.minor, p.multiProcessorCount, static_cast<int64_t>(p.totalGlobalMem)};
}

DeviceMemory device_memory(int device) {
  int previous = 0;
  DTLAB_CUDA_CHECK(cudaGetDevice(&previous));
  DTLAB_CUDA_CHECK(cudaSetDevice(device));
  size_t free_b = 0, total_b = 0;
  cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  DTLAB_CUDA_CHECK(cudaSetDevice(previous));
  DTLAB_CUDA_CHECK(e);
  return {static_cast<int64_t>(free_b), static_cast<int64_t>(total_b)};
}

std::string runtime_summary() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  char buf[96];
  std::snprintf(buf, sizeof buf, "CUDA runtime %d.%d, driver %d.%d", runtime / 1000, runtime % 1000 / 10,
                driver / 1000, driver % 1000 / 10);
  std::string s = buf;
  if (!cuda_available()) return s + "; " + unavailable_reason();
  for (int d = 0; d < device_count(); d++) {
    DeviceInfo i = device_info(d);
    std::snprintf(buf, sizeof buf, " (sm_%d%d, %d SMs, ", i.cc_major, i.cc_minor, i.multiprocessors);
    s += "; device " + std::to_string(d) + ": " + i.name + buf + human_bytes(i.total_bytes) + ")";
  }
  return s;
}

void fail_cuda(const char* file, int line, const char* call, cudaError_t e) {
  fail_library(file, line, call, std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")");
}

void fail_library(const char* file, int line, const char* call, const std::string& what) {
  throw CudaError("CUDA error at " + std::string(file) + ":" + std::to_string(line) + ": " + call + ": " + what);
}

// Tensors come from each device's stream-ordered pool (engine/cuda/cuda_device.cpp).
void prepare_pools(const std::vector<int>& devices, bool peers_required) {
  for (int d : devices) {
    int previous = 0;
    cudaGetDevice(&previous);
    DTLAB_CUDA_CHECK(cudaSetDevice(d));
    cudaMemPool_t pool;
    DTLAB_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, d));
    uint64_t keep = UINT64_MAX;  // keep freed scratch in the pool instead of returning it each sync
    DTLAB_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    for (int p : devices) {
      if (p == d) continue;
      int ok = 0;
      DTLAB_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, d, p));
      if (!ok && !peers_required) continue;  // NCCL then moves the data through its own buffers
      if (!ok)
        throw Error("CUDA devices " + std::to_string(d) + " and " + std::to_string(p) +
                    " cannot access each other's memory (no peer access); run the cuda backend on one device");
      cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
      else DTLAB_CUDA_CHECK(e);
      cudaMemAccessDesc access{};
      access.location.type = cudaMemLocationTypeDevice;
      access.location.id = p;
      access.flags = cudaMemAccessFlagsProtReadWrite;
      DTLAB_CUDA_CHECK(cudaMemPoolSetAccess(pool, &access, 1));
    }
    cudaSetDevice(previous);
  }
}

}  // namespace dtlab::cuda
