// Fills a DeviceQuery (engine/train/device_select.h) with what this build and machine have. Header
// only: the CUDA part compiles where the includer links dtlab_cuda (DTLAB_HAVE_CUDA), so the engine
// library itself never includes CUDA.
#pragma once
#include <cstdlib>

#include "engine/train/device_select.h"
#if DTLAB_HAVE_CUDA
#include "engine/cuda/runtime.h"
#endif

namespace dtlab {

// `asked_device` empty takes DTLAB_DEVICE (the test suites pin cpu with it).
inline void probe_devices(DeviceQuery& q) {
  if (q.device.empty())
    if (const char* env = std::getenv("DTLAB_DEVICE")) q.device = env;
#if DTLAB_HAVE_CUDA
  q.cuda_built = true;
  if (q.device != "cpu") {  // asking wakes the driver: not for runs that stay on the CPU
    q.gpus = cuda::device_count();
    q.no_gpu_reason = cuda::unavailable_reason();
  }
#endif
#if DTLAB_HAVE_NCCL
  q.nccl_built = true;
#endif
}

}  // namespace dtlab
