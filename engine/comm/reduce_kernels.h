// The element-wise pieces of the collective algorithms (reduce, average, copy; chunk bounds are in
// ring_order.h), shared by every backend: a collective adds the same numbers in the same order
// whichever backend moves them, so a multi-process socket run equals the in-process threads run
// bit for bit.
#pragma once
#include "engine/core/arith.h"
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/comm/communicator.h"
#include "engine/core/half.h"

namespace dtlab {

template <class T>
void reduce_into(T* dst, const T* src, int64_t len, ReduceOp op) {
  if (op == ReduceOp::Max) {
    for (int64_t i = 0; i < len; i++) dst[i] = std::max(dst[i], src[i]);
  } else {
    for (int64_t i = 0; i < len; i++) dst[i] += src[i];
  }
}

template <class T>
void reduce_to(T* dst, const T* a, const T* b, int64_t len, ReduceOp op) {
  if (op == ReduceOp::Max) {
    for (int64_t i = 0; i < len; i++) dst[i] = std::max(a[i], b[i]);
  } else {
    for (int64_t i = 0; i < len; i++) dst[i] = a[i] + b[i];
  }
}

// 16-bit elements: each sum is computed in float and rounded once (NCCL's per-step bf16/fp16 sums).
// Plain overloads, so they win over the templates above.
inline void reduce_half(uint16_t* dst, const uint16_t* a, const uint16_t* b, int64_t len, ReduceOp op, HalfFormat f) {
  for (int64_t i = 0; i < len; i++) {
    const float x = half_to_float(a[i], f), y = half_to_float(b[i], f);
    dst[i] = half_from_float(op == ReduceOp::Max ? std::max(x, y) : x + y, f);
  }
}
static_assert(std::is_standard_layout_v<Bf16Bits> && sizeof(Bf16Bits) == sizeof(uint16_t) &&
              std::is_standard_layout_v<Fp16Bits> && sizeof(Fp16Bits) == sizeof(uint16_t));
// The structs are their one uint16_t (standard layout): a pointer to one is a pointer to its bits,
// null included (an empty chunk passes null; `&a->bits` on it is undefined behaviour).
inline void reduce_to(Bf16Bits* dst, const Bf16Bits* a, const Bf16Bits* b, int64_t len, ReduceOp op) {
  reduce_half(reinterpret_cast<uint16_t*>(dst), reinterpret_cast<const uint16_t*>(a), reinterpret_cast<const uint16_t*>(b), len, op,
              HalfFormat::BF16);
}
inline void reduce_to(Fp16Bits* dst, const Fp16Bits* a, const Fp16Bits* b, int64_t len, ReduceOp op) {
  reduce_half(reinterpret_cast<uint16_t*>(dst), reinterpret_cast<const uint16_t*>(a), reinterpret_cast<const uint16_t*>(b), len, op,
              HalfFormat::FP16);
}
inline void reduce_into(Bf16Bits* dst, const Bf16Bits* src, int64_t len, ReduceOp op) { reduce_to(dst, dst, src, len, op); }
inline void reduce_into(Fp16Bits* dst, const Fp16Bits* src, int64_t len, ReduceOp op) { reduce_to(dst, dst, src, len, op); }

// Avg is a sum followed by this, on the rank that holds the final value.
template <class T>
void finish_avg(T* buf, int64_t len, ReduceOp op, int n) {
  if constexpr (std::is_same_v<T, float>) {
    if (op != ReduceOp::Avg || n == 1) return;
    const float inv = 1.0f / static_cast<float>(n);
    for (int64_t i = 0; i < len; i++) buf[i] *= inv;
  }
}

template <class T>
void copy_elems(T* dst, const T* src, int64_t len) {
  if (len > 0 && dst != src) std::memcpy(dst, src, static_cast<size_t>(len) * sizeof(T));
}

}  // namespace dtlab
