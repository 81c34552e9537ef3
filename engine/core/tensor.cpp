#include "engine/core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "engine/core/check.h"

namespace dtlab {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::I64: return "I64";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
  }
  return "?";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    DTLAB_CHECK(d >= 0, "negative dimension in a shape");
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); i++) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  if (s.size() == 1) out += ",";
  return out + ")";
}

Tensor::Tensor(Shape shape, MemCategory category, MemoryTracker* tracker, DType dtype, Device& device)
    : shape_(std::move(shape)), dtype_(dtype), category_(category), tracker_(tracker), device_(&device) {
  numel_ = shape_numel(shape_);
  int64_t bytes = nbytes();
  if (bytes > 0) {
    data_ = device_->allocate(bytes);  // zero-filled
    if (tracker_) tracker_->on_alloc(category_, bytes);
  }
}

Tensor::~Tensor() { release(); }

void Tensor::release() {
  if (data_) {
    if (tracker_) tracker_->on_free(category_, nbytes());
    device_->release(data_);
    data_ = nullptr;
  }
}

Tensor::Tensor(Tensor&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      shape_(std::move(o.shape_)),
      numel_(std::exchange(o.numel_, 0)),
      dtype_(o.dtype_),
      category_(o.category_),
      tracker_(o.tracker_),
      device_(o.device_) {}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    shape_ = std::move(o.shape_);
    numel_ = std::exchange(o.numel_, 0);
    dtype_ = o.dtype_;
    category_ = o.category_;
    tracker_ = o.tracker_;
    device_ = o.device_;
  }
  return *this;
}

void Tensor::zero() {
  if (data_) device_->fill_zero(data_, nbytes());
}

}  // namespace dtlab
