// Tensor: an owning, contiguous buffer of float32 (or int64) with a shape on one device (host memory,
// 64-byte aligned, by default; a GPU's memory with the cuda device), whose bytes are registered with a
// rank's MemoryTracker under a category for as long as it lives, so memory views count device memory
// exactly as they count host memory. Deliberately small: ops are the device's methods over raw
// pointers (llm.c style); Tensor only owns.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/memory.h"

namespace dtlab {

// F64 holds sums the host reads back (a step's loss on the device); collectives and files move F32/I64.
// BF16 and F16 are mixed precision's 16-bit storage (engine/core/half.h): parameters, activations,
// gradients and DDP's buckets under --precision bf16/fp16.
enum class DType : uint8_t { F32, I64, F64, BF16, F16 };

inline int64_t dtype_size(DType d) {
  return d == DType::F32 ? 4 : (d == DType::BF16 || d == DType::F16) ? 2 : 8;
}
const char* dtype_name(DType d);  // safetensors spelling: "F32", "I64", "F64", "BF16", "F16""

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "(64, 2)"

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled. `tracker` may be null (untracked scratch, e.g. in tests).
  Tensor(Shape shape, MemCategory category, MemoryTracker* tracker, DType dtype = DType::F32,
         Device& device = cpu_device());
  ~Tensor();
  Tensor(Tensor&& o) noexcept;
  Tensor& operator=(Tensor&& o) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  float* f32() { return static_cast<float*>(data_); }
  const float* f32() const { return static_cast<const float*>(data_); }
  int64_t* i64() { return static_cast<int64_t*>(data_); }
  const int64_t* i64() const { return static_cast<const int64_t*>(data_); }
  double* f64() { return static_cast<double*>(data_); }
  uint16_t* u16() { return static_cast<uint16_t*>(data_); }  // BF16, F16: the bit patterns
  const uint16_t* u16() const { return static_cast<const uint16_t*>(data_); }
  void* raw() { return data_; }
  const void* raw() const { return data_; }

  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[static_cast<size_t>(i)]; }
  int64_t numel() const { return numel_; }
  int64_t nbytes() const { return numel_ * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  MemCategory category() const { return category_; }
  bool empty() const { return data_ == nullptr; }
  Device& device() const { return *device_; }
  void zero();

 private:
  void release();
  void* data_ = nullptr;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::F32;
  MemCategory category_ = MemCategory::Other;
  MemoryTracker* tracker_ = nullptr;
  Device* device_ = &cpu_device();
};

}  // namespace dtlab
