// DeviceTensor: Tensor's twin in GPU memory. An owning, contiguous float32 (or int64) buffer on one
// device with a shape, whose bytes are registered with a rank's MemoryTracker under a category for
// as long as it lives, so memory views count device memory exactly as they count host memory
// (device_memory() in device.h gives the device's own free/total figure beside it).
#pragma once
#include <cuda_runtime.h>

#include <memory>

#include "engine/core/tensor.h"

namespace dtlab::cuda {

class DeviceTensor {
 public:
  DeviceTensor() = default;
  // Zero-filled before the constructor returns. `tracker` may be null (untracked scratch).
  DeviceTensor(Shape shape, MemCategory category, MemoryTracker* tracker, int device,
               DType dtype = DType::F32);

  float* f32() { return static_cast<float*>(raw()); }
  const float* f32() const { return static_cast<const float*>(raw()); }
  int64_t* i64() { return static_cast<int64_t*>(raw()); }
  const int64_t* i64() const { return static_cast<const int64_t*>(raw()); }
  void* raw() { return mem_.get(); }
  const void* raw() const { return mem_.get(); }

  const Shape& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  int64_t nbytes() const { return numel_ * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  MemCategory category() const { return category_; }
  int device() const { return device_; }
  bool empty() const { return mem_ == nullptr; }
  void zero(cudaStream_t stream);

 private:
  // Frees the device memory and gives its bytes back to the tracker; moves come with unique_ptr.
  struct Release {
    MemoryTracker* tracker;
    MemCategory category;
    int64_t bytes;
    int device;
    void operator()(void* p) const;
  };
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::F32;
  MemCategory category_ = MemCategory::Other;
  int device_ = 0;
  std::unique_ptr<void, Release> mem_{nullptr, Release{nullptr, MemCategory::Other, 0, 0}};
};

// Host <-> device, nbytes of `t`, ordered on `stream`. download() returns with the bytes on the host.
void upload(DeviceTensor& dst, const void* src, cudaStream_t stream);
void download(void* dst, const DeviceTensor& src, cudaStream_t stream);

}  // namespace dtlab::cuda
