#include "engine/cuda/device_tensor.h"

#include <utility>

#include "engine/cuda/device.h"

namespace dtlab::cuda {

namespace {

// Makes `device` current for a scope and restores the thread's previous device: a tensor may be
// freed by a thread that works on another GPU.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

DeviceTensor::DeviceTensor(Shape shape, MemCategory category, MemoryTracker* tracker, int device, DType dtype)
    : shape_(std::move(shape)), numel_(shape_numel(shape_)), dtype_(dtype), category_(category), device_(device) {
  if (numel_ == 0) return;
  void* p = nullptr;
  DeviceGuard on(device_);
  DTLAB_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(nbytes())));
  if (tracker) tracker->on_alloc(category_, nbytes());
  mem_ = std::unique_ptr<void, Release>(p, Release{tracker, category_, nbytes(), device_});
  // On the legacy stream and waited for: the rank's non-blocking streams would not order after it.
  DTLAB_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(nbytes()), nullptr));
  DTLAB_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

void DeviceTensor::Release::operator()(void* p) const {
  DeviceGuard on(device);
  cudaFree(p);  // synchronizes the device: no kernel still uses it
  if (tracker) tracker->on_free(category, bytes);
}

void DeviceTensor::zero(cudaStream_t stream) {
  if (mem_) DTLAB_CUDA_CHECK(cudaMemsetAsync(mem_.get(), 0, static_cast<size_t>(nbytes()), stream));
}

void upload(DeviceTensor& dst, const void* src, cudaStream_t stream) {
  DTLAB_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src, static_cast<size_t>(dst.nbytes()), cudaMemcpyHostToDevice, stream));
  // From pageable memory the copy is staged; waiting makes `src` free to change at once.
  DTLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void download(void* dst, const DeviceTensor& src, cudaStream_t stream) {
  DTLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src.raw(), static_cast<size_t>(src.nbytes()), cudaMemcpyDeviceToHost, stream));
  DTLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace dtlab::cuda
