#include "engine/core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "engine/core/check.h"

namespace dtlab {

const char* dtype_name(DType d) { return d == DType::F32 ? "F32" : "I64"; }

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

Tensor::Tensor(Shape shape, MemCategory category, MemoryTracker* tracker, DType dtype)
    : shape_(std::move(shape)), dtype_(dtype), category_(category), tracker_(tracker) {
  numel_ = shape_numel(shape_);
  int64_t bytes = nbytes();
  if (bytes > 0) {
    // 64-byte alignment: whole cache lines, and AVX-512 loads never straddle them.
    size_t padded = (static_cast<size_t>(bytes) + 63) & ~size_t(63);
    data_ = std::aligned_alloc(64, padded);
    if (!data_) throw std::bad_alloc();
    std::memset(data_, 0, padded);
    if (tracker_) tracker_->on_alloc(category_, bytes);
  }
}

Tensor::~Tensor() { release(); }

void Tensor::release() {
  if (data_) {
    if (tracker_) tracker_->on_free(category_, nbytes());
    std::free(data_);
    data_ = nullptr;
  }
}

Tensor::Tensor(Tensor&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      shape_(std::move(o.shape_)),
      numel_(std::exchange(o.numel_, 0)),
      dtype_(o.dtype_),
      category_(o.category_),
      tracker_(o.tracker_) {}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    shape_ = std::move(o.shape_);
    numel_ = std::exchange(o.numel_, 0);
    dtype_ = o.dtype_;
    category_ = o.category_;
    tracker_ = o.tracker_;
  }
  return *this;
}

void Tensor::zero() {
  if (data_) std::memset(data_, 0, static_cast<size_t>(nbytes()));
}

}  // namespace dtlab
